package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func kvUint(t *testing.T, f *gguf.File, key string) (uint64, bool) {
	t.Helper()
	kv, ok := f.KV(key)
	if !ok {
		return 0, false
	}
	v, ok := kv.Uint()
	if !ok {
		t.Fatalf("%s is %s", key, kv.Type)
	}
	return v, true
}

// values decodes an F32/F16/BF16 tensor of f.
func values(t *testing.T, f *gguf.File, name string) []float32 {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	b, err := io.ReadAll(f.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, ti.NumElements())
	dt := map[quant.Type]tensor.DType{quant.F32: tensor.F32, quant.F16: tensor.F16, quant.BF16: tensor.BF16}[ti.Type]
	if err := tensor.ToF32(dt, out, b); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// asF16 rounds like the F16 output does.
func asF16(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = tensor.F16ToFloat32(tensor.Float32ToF16(x))
	}
	return out
}

func sameValues(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
			return
		}
	}
}

func mvalues(t *testing.T, m *testmodel.Model, name string) []float32 {
	t.Helper()
	v, err := m.Values(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// tiledV reorders an axis laid out [nk][r][hd] (grouped by K head) into
// [r][nk][hd], written out independently of the converter's formula.
func tiledV(in []float32, nk, r, hd int) []float32 {
	out := make([]float32, 0, len(in))
	for v := 0; v < r; v++ {
		for k := 0; k < nk; k++ {
			out = append(out, in[(k*r+v)*hd:(k*r+v)*hd+hd]...)
		}
	}
	return out
}

func rowsOf(v []float32, cols int) [][]float32 {
	var out [][]float32
	for i := 0; i+cols <= len(v); i += cols {
		out = append(out, v[i:i+cols])
	}
	return out
}

func flat(rows [][]float32) []float32 {
	var out []float32
	for _, r := range rows {
		out = append(out, r...)
	}
	return out
}

// reorderRows applies tiledV to rows (each row is one element of the axis).
func reorderRows(rows [][]float32, nk, r, hd int) [][]float32 {
	idx := make([]float32, len(rows))
	for i := range idx {
		idx[i] = float32(i)
	}
	var out [][]float32
	for _, i := range tiledV(idx, nk, r, hd) {
		out = append(out, rows[int(i)])
	}
	return out
}

func TestMTPModes(t *testing.T) {
	tests := []struct {
		name      string
		opts      Options
		blocks    uint64
		nextn     uint64 // 0: key absent
		tensors   int
		wantBlk4  bool
		wantTrunk bool
	}{
		{"default keeps the MTP block", Options{}, 5, 1, 71, true, true},
		{"--no-mtp", Options{NoMTP: true}, 4, 0, 56, false, true},
		{"--mtp-only", Options{MTPOnly: true}, 5, 1, 18, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _ := convertDir(t, qwen35Dir, tt.opts, WriteOptions{})
			f := openGGUF(t, out)
			if bc, _ := kvUint(t, f, "qwen35.block_count"); bc != tt.blocks {
				t.Errorf("block_count %d, want %d", bc, tt.blocks)
			}
			n, ok := kvUint(t, f, "qwen35.nextn_predict_layers")
			if n != tt.nextn || ok != (tt.nextn > 0) {
				t.Errorf("nextn_predict_layers %d (present %v), want %d", n, ok, tt.nextn)
			}
			if len(f.Tensors) != tt.tensors {
				t.Errorf("%d tensors, want %d", len(f.Tensors), tt.tensors)
			}
			var blk4, nextn, trunk int
			for _, ti := range f.Tensors {
				switch {
				case strings.HasPrefix(ti.Name, "blk.4."):
					blk4++
					if strings.Contains(ti.Name, ".nextn.") {
						nextn++
					}
				case strings.HasPrefix(ti.Name, "blk."):
					trunk++
				}
			}
			if (blk4 == 15) != tt.wantBlk4 || (tt.wantBlk4 && nextn != 4) || (!tt.wantBlk4 && blk4 != 0) {
				t.Errorf("%d blk.4 tensors (%d nextn)", blk4, nextn)
			}
			if (trunk > 0) != tt.wantTrunk {
				t.Errorf("%d trunk block tensors", trunk)
			}
			for _, name := range []string{"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight", "blk.4.nextn.shared_head_norm.weight", "blk.4.attn_q.weight"} {
				if _, ok := f.Tensor(name); ok != tt.wantBlk4 {
					t.Errorf("%s present %v", name, ok)
				}
			}
			if tt.opts.MTPOnly {
				for _, name := range []string{"token_embd.weight", "output_norm.weight", "output.weight"} {
					if _, ok := f.Tensor(name); !ok {
						t.Errorf("--mtp-only lacks %s", name)
					}
				}
			}
		})
	}
}

// A checkpoint whose config promises MTP but whose shards lack mtp.* (what
// a PEFT merge_and_unload writes) is refused before anything is written,
// unless --no-mtp.
func TestMTPPromisedButMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := (testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}}).Write(dir); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	_, err = NewPlan(ck, Options{})
	if !errors.Is(err, ErrMTPMissing) {
		t.Fatalf("err = %v, want ErrMTPMissing", err)
	}
	var bi interface{ BadInput() bool }
	if !errors.As(err, &bi) || !bi.BadInput() || !strings.Contains(err.Error(), "--no-mtp") || !strings.Contains(err.Error(), "mtp_num_hidden_layers = 1") {
		t.Errorf("error not a clear bad-input error: %v", err)
	}
	p, err := NewPlan(ck, Options{NoMTP: true})
	if err != nil {
		t.Fatalf("--no-mtp: %v", err)
	}
	if p.MTPLayers != 0 {
		t.Errorf("--no-mtp plan has %d MTP layers", p.MTPLayers)
	}
}

// writeSingle writes a one-file checkpoint into a new directory from src,
// dropping tensors and editing config.json.
func writeSingle(t *testing.T, src string, drop func(string) bool, editCfg func(map[string]any)) string {
	t.Helper()
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dir := t.TempDir()
	var specs []safetensors.TensorSpec
	for _, l := range ck.Tensors() {
		if drop == nil || !drop(l.Info.Name) {
			specs = append(specs, safetensors.TensorSpec{Name: l.Info.Name, DType: l.Info.DType, Shape: l.Info.Shape})
		}
	}
	w, err := safetensors.Create(filepath.Join(dir, "model.safetensors"), map[string]string{"format": "pt"}, specs)
	if err != nil {
		t.Fatal(err)
	}
	for !w.Done() {
		name := w.Next()
		l, _ := ck.Lookup(name)
		if err := w.WriteTensor(name, l.Section()); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if b, err := os.ReadFile(filepath.Join(src, f)); err == nil {
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
	}
	cfg := readJSONMap(filepath.Join(src, "config.json"))
	if editCfg != nil {
		editCfg(cfg)
	}
	b, _ := jsonMarshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPlanRefusesBadInput(t *testing.T) {
	q3 := t.TempDir()
	if _, err := (testmodel.Qwen3Options{}).Write(q3); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dir  func() string
		opts Options
		want error
		msg  string
	}{
		{"unknown architecture", func() string {
			return writeSingle(t, q3, nil, func(c map[string]any) { c["architectures"] = []any{"MistralForCausalLM"} })
		}, Options{}, ErrUnsupportedArch, "Qwen3_5ForCausalLM"},
		{"missing tensor", func() string {
			return writeSingle(t, q3, func(n string) bool { return n == "model.layers.1.mlp.up_proj.weight" }, nil)
		}, Options{}, ErrMissingTensor, "blk.1.ffn_up.weight"},
		{"shape mismatch", func() string {
			return writeSingle(t, q3, nil, func(c map[string]any) { c["intermediate_size"] = 96 })
		}, Options{}, ErrShape, "model.layers.0.mlp."},
		{"unmappable tensor", func() string {
			dir := writeSingle(t, q3, nil, func(c map[string]any) { c["num_hidden_layers"] = 1 })
			return dir
		}, Options{}, ErrUnknownTensor, "model.layers.1."},
		{"no config", func() string {
			dir := writeSingle(t, q3, nil, nil)
			os.Remove(filepath.Join(dir, "config.json"))
			return dir
		}, Options{}, ErrConfig, "config.json"},
		{"bad outtype", func() string { return q3 }, Options{OutType: "q4_k"}, ErrOptions, "q4_k"},
		{"no-mtp with mtp-only", func() string { return q3 }, Options{NoMTP: true, MTPOnly: true}, ErrOptions, "--no-mtp"},
		{"no MTP anywhere", func() string {
			d := t.TempDir()
			if _, err := (testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{NoMTP: true}}).Write(d); err != nil {
				t.Fatal(err)
			}
			return d
		}, Options{}, ErrMTPMissing, "--no-mtp"},
		{"sentencepiece tokenizer", func() string {
			d := writeSingle(t, q3, nil, nil)
			os.WriteFile(filepath.Join(d, "tokenizer.model"), []byte("x"), 0o644)
			return d
		}, Options{}, ErrTokenizer, "sentencepiece"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir()
			ck, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			_, err = NewPlan(ck, tt.opts)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var ce *Error
			if !errors.As(err, &ce) || !ce.BadInput() {
				t.Fatalf("%v is not a *convert.Error", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not mention %q", err, tt.msg)
			}
			t.Log(err)
		})
	}
}

// Every family converts, parses with gguf-parser-go and our reader, and
// each transform gives the values computed here from the generator's.
func TestFamilies(t *testing.T) {
	type gen interface {
		Write(string) (*testmodel.Model, error)
	}
	tests := []struct {
		name  string
		gen   gen
		arch  string
		check func(t *testing.T, m *testmodel.Model, f *gguf.File)
	}{
		{"llama", testmodel.LlamaOptions{}, "llama", checkLlama},
		{"qwen2", testmodel.Qwen2Options{}, "qwen2", checkQwen2},
		{"qwen3-tied", testmodel.Qwen3Options{Common: testmodel.Common{TieWordEmbeddings: true}}, "qwen3", checkQwen3Tied},
		{"qwen35", testmodel.Qwen35Options{}, "qwen35", checkQwen35},
		{"qwen35-condgen", testmodel.Qwen35Options{ConditionalGeneration: true}, "qwen35", checkQwen35},
		{"qwen35moe", testmodel.Qwen35MoEOptions{}, "qwen35moe", checkQwen35MoE},
		{"qwen35moe-fused", testmodel.Qwen35MoEOptions{MoE: testmodel.MoE{FusedExperts: true, FusedMTPExperts: true}}, "qwen35moe", checkQwen35MoE},
		{"qwen3next", testmodel.Qwen3NextOptions{}, "qwen3next", checkQwen3Next},
		{"qwen35-f32-weights", testmodel.Qwen35Options{Common: testmodel.Common{DType: tensor.F32}}, "qwen35", checkQwen35},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "model")
			m, err := tt.gen.Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := convertDir(t, dir, Options{}, WriteOptions{Jobs: 2, ChunkElems: 1000})
			f := openGGUF(t, out)
			if f.Architecture() != tt.arch {
				t.Fatalf("architecture %q", f.Architecture())
			}
			if v, _ := f.KV("tokenizer.ggml.tokens"); v.Value.(gguf.Array).Len() != 512 {
				t.Errorf("tokens: %d", v.Value.(gguf.Array).Len())
			}
			tt.check(t, m, f)
		})
	}
}

func checkLlama(t *testing.T, m *testmodel.Model, f *gguf.File) {
	heads, kvHeads, hd := cfgInt(m, "num_attention_heads"), cfgInt(m, "num_key_value_heads"), cfgInt(m, "head_dim")
	for _, c := range []struct {
		hf, gg string
		n      int
	}{{"q_proj", "attn_q", heads}, {"k_proj", "attn_k", kvHeads}} {
		src := mvalues(t, m, "model.layers.0.self_attn."+c.hf+".weight")
		cols := len(src) / (c.n * hd)
		rows := rowsOf(src, cols)
		var want [][]float32
		for h := 0; h < c.n; h++ { // (h, 2, hd/2) → swap → (h, hd/2, 2)
			for b := 0; b < hd/2; b++ {
				for a := 0; a < 2; a++ {
					want = append(want, rows[h*hd+a*hd/2+b])
				}
			}
		}
		sameValues(t, c.gg, values(t, f, "blk.0."+c.gg+".weight"), asF16(flat(want)))
	}
	sameValues(t, "attn_v unpermuted", values(t, f, "blk.0.attn_v.weight"), asF16(mvalues(t, m, "model.layers.0.self_attn.v_proj.weight")))
	if v, _ := kvUint(t, f, "llama.rope.dimension_count"); int(v) != hd {
		t.Errorf("rope.dimension_count %d", v)
	}
	if v, _ := kvUint(t, f, "llama.vocab_size"); v != 512 {
		t.Errorf("vocab_size %d", v)
	}
}

func checkQwen2(t *testing.T, m *testmodel.Model, f *gguf.File) {
	ti, ok := f.Tensor("blk.1.attn_q.bias")
	if !ok || ti.Type != quant.F32 {
		t.Fatalf("attn_q.bias %+v %v", ti, ok)
	}
	sameValues(t, "attn_q.bias", values(t, f, "blk.1.attn_q.bias"), mvalues(t, m, "model.layers.1.self_attn.q_proj.bias"))
	sameValues(t, "ffn_norm (no +1)", values(t, f, "blk.0.ffn_norm.weight"), mvalues(t, m, "model.layers.0.post_attention_layernorm.weight"))
}

func checkQwen3Tied(t *testing.T, m *testmodel.Model, f *gguf.File) {
	if _, ok := f.Tensor("output.weight"); ok {
		t.Error("tied model has output.weight")
	}
	sameValues(t, "attn_q_norm", values(t, f, "blk.0.attn_q_norm.weight"), mvalues(t, m, "model.layers.0.self_attn.q_norm.weight"))
	sameValues(t, "token_embd", values(t, f, "token_embd.weight"), asF16(mvalues(t, m, "model.embed_tokens.weight")))
}

func cfgInt(m *testmodel.Model, key string) int {
	switch v := m.TextConfig[key].(type) {
	case int:
		return v
	case int64:
		return int(v)
	case float64:
		return int(v)
	}
	panic(fmt.Sprintf("config %s = %T", key, m.TextConfig[key]))
}

func plusOne(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = x + 1
	}
	return out
}

// checkHybridCommon covers what Qwen3.5 (dense and MoE) share: V-head
// reorder, -exp(A_log), dt_bias, conv1d, norms, the MTP block.
func checkHybridCommon(t *testing.T, m *testmodel.Model, f *gguf.File, reorder bool) {
	nk, nv := cfgInt(m, "linear_num_key_heads"), cfgInt(m, "linear_num_value_heads")
	hk, hv := cfgInt(m, "linear_key_head_dim"), cfgInt(m, "linear_value_head_dim")
	r := nv / nk
	p := m.Prefix + "layers.0.linear_attn."
	ord := func(v []float32, hd int) []float32 {
		if !reorder {
			return v
		}
		return tiledV(v, nk, r, hd)
	}
	alog := ord(mvalues(t, m, p+"A_log"), 1)
	want := make([]float32, len(alog))
	for i, x := range alog {
		want[i] = -torchExpF32(x) // the checkpoint is BF16: torch's float32 exp
	}
	sameValues(t, "ssm_a", values(t, f, "blk.0.ssm_a"), want)
	sameValues(t, "ssm_dt.bias", values(t, f, "blk.0.ssm_dt.bias"), ord(mvalues(t, m, p+"dt_bias"), 1))
	sameValues(t, "ssm_norm (no +1)", values(t, f, "blk.0.ssm_norm.weight"), mvalues(t, m, p+"norm.weight"))
	sameValues(t, "attn_norm (+1)", values(t, f, "blk.0.attn_norm.weight"), plusOne(mvalues(t, m, m.Prefix+"layers.0.input_layernorm.weight")))
	sameValues(t, "post_attention_norm (+1)", values(t, f, "blk.0.post_attention_norm.weight"), plusOne(mvalues(t, m, m.Prefix+"layers.0.post_attention_layernorm.weight")))
	sameValues(t, "output_norm (+1)", values(t, f, "output_norm.weight"), plusOne(mvalues(t, m, m.Prefix+"norm.weight")))

	// conv1d [C,1,K] squeezed; the V channels reordered.
	K := cfgInt(m, "linear_conv_kernel_dim")
	conv := rowsOf(mvalues(t, m, p+"conv1d.weight"), K)
	qk := 2 * nk * hk
	if reorder {
		conv = append(conv[:qk:qk], reorderRows(conv[qk:], nk, r, hv)...)
	}
	ti, _ := f.Tensor("blk.0.ssm_conv1d.weight")
	if ti.Type != quant.F32 || fmt.Sprint(ti.Dims) != fmt.Sprint([]uint64{uint64(K), uint64(len(conv))}) {
		t.Errorf("ssm_conv1d %s %v", ti.Type, ti.Dims)
	}
	sameValues(t, "ssm_conv1d", values(t, f, "blk.0.ssm_conv1d.weight"), flat(conv))

	// MTP block.
	L := cfgInt(m, "num_hidden_layers")
	sameValues(t, "nextn.enorm", values(t, f, fmt.Sprintf("blk.%d.nextn.enorm.weight", L)), plusOne(mvalues(t, m, "mtp.pre_fc_norm_embedding.weight")))
	sameValues(t, "nextn.shared_head_norm", values(t, f, fmt.Sprintf("blk.%d.nextn.shared_head_norm.weight", L)), plusOne(mvalues(t, m, "mtp.norm.weight")))
	sameValues(t, "nextn.eh_proj", values(t, f, fmt.Sprintf("blk.%d.nextn.eh_proj.weight", L)), asF16(mvalues(t, m, "mtp.fc.weight")))
	sameValues(t, "MTP attn_q", values(t, f, fmt.Sprintf("blk.%d.attn_q.weight", L)), asF16(mvalues(t, m, "mtp.layers.0.self_attn.q_proj.weight")))
	if n, _ := kvUint(t, f, f.Architecture()+".nextn_predict_layers"); n != 1 {
		t.Errorf("nextn_predict_layers %d", n)
	}
}

func checkQwen35(t *testing.T, m *testmodel.Model, f *gguf.File) {
	checkHybridCommon(t, m, f, true)
	nk, nv := cfgInt(m, "linear_num_key_heads"), cfgInt(m, "linear_num_value_heads")
	hk, hv := cfgInt(m, "linear_key_head_dim"), cfgInt(m, "linear_value_head_dim")
	r := nv / nk
	p := m.Prefix + "layers.0.linear_attn."
	H := cfgInt(m, "hidden_size")
	qkv := rowsOf(mvalues(t, m, p+"in_proj_qkv.weight"), H)
	qk := 2 * nk * hk
	want := append(qkv[:qk:qk], reorderRows(qkv[qk:], nk, r, hv)...)
	sameValues(t, "attn_qkv", values(t, f, "blk.0.attn_qkv.weight"), asF16(flat(want)))
	sameValues(t, "attn_gate", values(t, f, "blk.0.attn_gate.weight"), asF16(flat(reorderRows(rowsOf(mvalues(t, m, p+"in_proj_z.weight"), H), nk, r, hv))))
	sameValues(t, "ssm_beta", values(t, f, "blk.0.ssm_beta.weight"), asF16(flat(reorderRows(rowsOf(mvalues(t, m, p+"in_proj_b.weight"), H), nk, r, 1))))
	sameValues(t, "ssm_alpha", values(t, f, "blk.0.ssm_alpha.weight"), asF16(flat(reorderRows(rowsOf(mvalues(t, m, p+"in_proj_a.weight"), H), nk, r, 1))))
	var outWant [][]float32
	for _, row := range rowsOf(mvalues(t, m, p+"out_proj.weight"), nv*hv) {
		outWant = append(outWant, tiledV(row, nk, r, hv))
	}
	sameValues(t, "ssm_out (columns)", values(t, f, "blk.0.ssm_out.weight"), asF16(flat(outWant)))
	if v, ok := f.KV(f.Architecture() + ".rope.dimension_sections"); !ok || v.Value.(gguf.Array).Len() != 4 {
		t.Errorf("rope.dimension_sections %v", v)
	}
	// testmodel's tokenizer splits with Qwen2's regex, whatever the family.
	if s, _ := f.KV("tokenizer.ggml.pre"); s.Value != "qwen2" {
		t.Errorf("pre %v", s.Value)
	}
}

func checkExperts(t *testing.T, m *testmodel.Model, f *gguf.File, layer int, prefix string) {
	E := cfgInt(m, "num_experts")
	fused := false
	if _, ok := m.Lookup(prefix + "mlp.experts.gate_up_proj"); ok {
		fused = true
	}
	for _, w := range []string{"down", "gate", "up"} {
		var want []float32
		if fused {
			if w == "down" {
				want = mvalues(t, m, prefix+"mlp.experts.down_proj")
			} else {
				gu := mvalues(t, m, prefix+"mlp.experts.gate_up_proj")
				H := cfgInt(m, "hidden_size")
				I := cfgInt(m, "moe_intermediate_size")
				for e := 0; e < E; e++ {
					base := e * 2 * I * H
					if w == "up" {
						base += I * H
					}
					want = append(want, gu[base:base+I*H]...)
				}
			}
		} else {
			for e := 0; e < E; e++ {
				want = append(want, mvalues(t, m, fmt.Sprintf("%smlp.experts.%d.%s_proj.weight", prefix, e, w))...)
			}
		}
		name := fmt.Sprintf("blk.%d.ffn_%s_exps.weight", layer, w)
		ti, ok := f.Tensor(name)
		if !ok || len(ti.Dims) != 3 || ti.Dims[2] != uint64(E) {
			t.Errorf("%s: %+v", name, ti)
			continue
		}
		sameValues(t, name, values(t, f, name), asF16(want))
	}
	for _, n := range []string{"ffn_gate_inp", "ffn_gate_inp_shexp"} {
		if ti, _ := f.Tensor(fmt.Sprintf("blk.%d.%s.weight", layer, n)); ti.Type != quant.F32 {
			t.Errorf("%s is %s, want F32", n, ti.Type)
		}
	}
}

func checkQwen35MoE(t *testing.T, m *testmodel.Model, f *gguf.File) {
	checkQwen35(t, m, f)
	checkExperts(t, m, f, 0, m.Prefix+"layers.0.")
	checkExperts(t, m, f, cfgInt(m, "num_hidden_layers"), "mtp.layers.0.")
	if v, _ := kvUint(t, f, "qwen35moe.expert_count"); int(v) != cfgInt(m, "num_experts") {
		t.Errorf("expert_count %d", v)
	}
}

func checkQwen3Next(t *testing.T, m *testmodel.Model, f *gguf.File) {
	checkHybridCommon(t, m, f, false)
	checkExperts(t, m, f, 0, "model.layers.0.")
	nk, nv := cfgInt(m, "linear_num_key_heads"), cfgInt(m, "linear_num_value_heads")
	hk, hv := cfgInt(m, "linear_key_head_dim"), cfgInt(m, "linear_value_head_dim")
	r := nv / nk
	H := cfgInt(m, "hidden_size")
	rows := rowsOf(mvalues(t, m, "model.layers.0.linear_attn.in_proj_qkvz.weight"), H)
	per := 2*hk + 2*r*hv
	var q, k, v, z [][]float32
	for h := 0; h < nk; h++ {
		g := rows[h*per : (h+1)*per]
		q = append(q, g[:hk]...)
		k = append(k, g[hk:2*hk]...)
		v = append(v, g[2*hk:2*hk+r*hv]...)
		z = append(z, g[2*hk+r*hv:]...)
	}
	sameValues(t, "attn_qkv", values(t, f, "blk.0.attn_qkv.weight"), asF16(flat(append(append(q, k...), v...))))
	sameValues(t, "attn_gate", values(t, f, "blk.0.attn_gate.weight"), asF16(flat(z)))
	sameValues(t, "ssm_ba", values(t, f, "blk.0.ssm_ba.weight"), asF16(mvalues(t, m, "model.layers.0.linear_attn.in_proj_ba.weight")))
	if _, ok := f.KV("qwen3next.rope.dimension_sections"); ok {
		t.Error("qwen3next has rope.dimension_sections")
	}
}

// The output does not depend on the worker count or chunk size.
func TestDeterministic(t *testing.T) {
	var first string
	for _, wo := range []WriteOptions{{Jobs: 1}, {Jobs: 4, ChunkElems: 777}, {Jobs: 3, ChunkElems: 64}} {
		out, _ := convertDir(t, qwen35Dir, Options{}, wo)
		g := dumpGGUF(t, out, "")
		if first == "" {
			first = g.SHA256
		} else if g.SHA256 != first {
			t.Errorf("jobs %d chunk %d: sha256 %s, first run %s", wo.Jobs, wo.ChunkElems, g.SHA256, first)
		}
	}
}

// An interrupted conversion leaves only a .partial file; a resumed one
// that trusts the tensors its journal recorded ends byte-identical.
func TestInterruptAndResume(t *testing.T) {
	p := planDir(t, qwen35Dir)
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	ctx, cancel := context.WithCancel(context.Background())
	journal := map[string]bool{}
	var done int
	err := Write(ctx, p, out, WriteOptions{Jobs: 1, TensorDone: func(i int, name string) {
		journal[name] = true
		if done++; done == 20 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted write: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatal("final file exists after an interrupted write")
	}
	if _, err := os.Stat(out + ".partial"); err != nil {
		t.Fatalf("no partial file: %v", err)
	}
	var skipped int
	var sum []byte
	err = Write(context.Background(), p, out, WriteOptions{Jobs: 2, Resume: true, Verify: func(i int, name string, r *io.SectionReader) bool {
		if journal[name] {
			skipped++
			return true
		}
		return false
	}, Digest: func(s []byte) { sum = s }})
	if err != nil {
		t.Fatal(err)
	}
	if skipped < 20 {
		t.Errorf("resume skipped %d tensors", skipped)
	}
	want := loadGolden(t, "qwen35-base-F16")
	got := dumpGGUF(t, out, "")
	compareGolden(t, got, want, nil, false)
	wantIdentical(t, got, want, "resumed: ")
	// The digest hashed the skipped tensors from the partial file.
	if hex.EncodeToString(sum) != got.SHA256 {
		t.Errorf("resumed write's digest %x, file sha256 %s", sum, got.SHA256)
	}
}

// WriteOptions.Digest is the sha256 of the file written, whatever the
// worker count and unit size (many units per tensor, out of order).
func TestWriteDigest(t *testing.T) {
	ck, err := safetensors.OpenDir(qwen35Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, tc := range []struct {
		jobs  int
		chunk int64
		out   OutType
	}{{1, 0, OutF16}, {4, 0, OutF16}, {3, 1000, OutF16}, {8, 64, OutQ8_0}, {2, 4096, OutF32}} {
		t.Run(fmt.Sprintf("jobs%d-chunk%d-%s", tc.jobs, tc.chunk, tc.out), func(t *testing.T) {
			p, err := NewPlan(ck, Options{OutType: tc.out})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "m.gguf")
			var sum []byte
			if err := Write(context.Background(), p, out, WriteOptions{Jobs: tc.jobs, ChunkElems: tc.chunk, Digest: func(s []byte) { sum = s }}); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(b)
			if !bytes.Equal(sum, want[:]) {
				t.Errorf("digest %x, file sha256 %x", sum, want)
			}
		})
	}
}

// general.sampling.* come from generation_config.json, before general.name
// (Metadata.load then set_gguf_meta_model); config.json's _name_or_path
// gives the name parts when it is a model id.
func TestGeneralKeys(t *testing.T) {
	q3 := t.TempDir()
	if _, err := (testmodel.Qwen3Options{}).Write(q3); err != nil {
		t.Fatal(err)
	}
	dir := writeSingle(t, q3, nil, func(c map[string]any) { c["_name_or_path"] = "Acme/Tiny-Qwen3-Instruct-v2" })
	gen := `{"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "bos_token_id": 509}`
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(gen), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := convertDir(t, dir, Options{}, WriteOptions{})
	f := openGGUF(t, out)
	var got []string
	for _, kv := range f.KVs[:10] {
		got = append(got, fmt.Sprintf("%s %s %v", kv.Key, kv.Type, kv.Value))
	}
	want := []string{
		"general.architecture STRING qwen3",
		"general.type STRING model",
		"general.sampling.top_k INT32 20",
		"general.sampling.top_p FLOAT32 0.95",
		"general.sampling.temp FLOAT32 0.6",
		"general.name STRING Tiny Qwen3 Instruct v2",
		"general.version STRING v2",
		"general.organization STRING Acme",
		"general.finetune STRING Instruct",
		"general.basename STRING Tiny-Qwen3",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("first keys:\n got %q\nwant %q", got, want)
	}
}
