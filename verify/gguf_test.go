package verify

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// refGGUF parses the reference qwen35 F16 header (materialized sparse).
func refGGUF(t testing.TB) *gguf.File {
	t.Helper()
	f, err := gguf.Open(materializeGGUF(t, "qwen35-base-F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// ggufEdit describes a GGUF derived from the reference header.
type ggufEdit struct {
	kvs     func([]gguf.KV) []gguf.KV
	tensors func([]gguf.TensorSpec) []gguf.TensorSpec
	// fill gives tensor bytes by name; others are zero (sparse) unless
	// fillHead, which fills every blk.4 tensor with healthy values.
	fill     map[string]func(n int64) []byte
	fillHead bool
}

func setKV(key string, kv gguf.KV) func([]gguf.KV) []gguf.KV {
	return func(kvs []gguf.KV) []gguf.KV {
		out := slices.Clone(kvs)
		for i := range out {
			if out[i].Key == key {
				out[i] = kv
				return out
			}
		}
		return append(out, kv)
	}
}

func dropKV(keys ...string) func([]gguf.KV) []gguf.KV {
	return func(kvs []gguf.KV) []gguf.KV {
		return slices.DeleteFunc(slices.Clone(kvs), func(kv gguf.KV) bool { return slices.Contains(keys, kv.Key) })
	}
}

func chainKV(fs ...func([]gguf.KV) []gguf.KV) func([]gguf.KV) []gguf.KV {
	return func(kvs []gguf.KV) []gguf.KV {
		for _, f := range fs {
			kvs = f(kvs)
		}
		return kvs
	}
}

func dropTensors(pred func(string) bool) func([]gguf.TensorSpec) []gguf.TensorSpec {
	return func(ts []gguf.TensorSpec) []gguf.TensorSpec {
		return slices.DeleteFunc(slices.Clone(ts), func(s gguf.TensorSpec) bool { return pred(s.Name) })
	}
}

func retype(name string, ty quant.Type, dims ...uint64) func([]gguf.TensorSpec) []gguf.TensorSpec {
	return func(ts []gguf.TensorSpec) []gguf.TensorSpec {
		out := slices.Clone(ts)
		for i := range out {
			if out[i].Name == name {
				out[i].Type = ty
				if dims != nil {
					out[i].Dims = dims
				}
			}
		}
		return out
	}
}

// healthy returns valid, nonzero, finite bytes for a tensor of type ty.
func healthy(ty quant.Type, n int64) []byte {
	b := make([]byte, n)
	unit := int(ty.TypeSize())
	for u := 0; u+unit <= len(b); u += unit {
		blk := b[u : u+unit]
		switch ty {
		case quant.F32:
			binary.LittleEndian.PutUint32(blk, 0x3F800000) // 1.0
		case quant.F16:
			binary.LittleEndian.PutUint16(blk, 0x3C00) // 1.0
		case quant.Q8_0:
			binary.LittleEndian.PutUint16(blk, 0x2000) // d
			for i := 2; i < 34; i++ {
				blk[i] = 3
			}
		case quant.Q4_K, quant.Q5_K:
			binary.LittleEndian.PutUint16(blk, 0x2000)     // d
			binary.LittleEndian.PutUint16(blk[2:], 0x1000) // dmin
			for i := 4; i < len(blk); i++ {
				blk[i] = 0x11
			}
		case quant.Q6_K:
			for i := range blk {
				blk[i] = 0x11
			}
			binary.LittleEndian.PutUint16(blk[208:], 0x2000) // d
		}
	}
	return b
}

// writeGGUF plans and writes a GGUF derived from the reference header.
func writeGGUF(t testing.TB, e ggufEdit) string {
	t.Helper()
	ref := refGGUF(t)
	kvs := slices.Clone(ref.KVs)
	if e.kvs != nil {
		kvs = e.kvs(kvs)
	}
	specs := make([]gguf.TensorSpec, len(ref.Tensors))
	for i, ti := range ref.Tensors {
		specs[i] = gguf.TensorSpec{Name: ti.Name, Dims: slices.Clone(ti.Dims), Type: ti.Type}
	}
	if e.tensors != nil {
		specs = e.tensors(specs)
	}
	l, err := gguf.PlanLayout(kvs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write(l.Header); err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(l.Size); err != nil {
		t.Fatal(err)
	}
	for i, ti := range l.Tensors {
		var data []byte
		if f, ok := e.fill[ti.Name]; ok {
			data = f(ti.Size())
		} else if e.fillHead && strings.HasPrefix(ti.Name, "blk.4.") {
			data = healthy(ti.Type, ti.Size())
		}
		if data == nil {
			continue
		}
		if int64(len(data)) != ti.Size() {
			t.Fatalf("%s: %d bytes of fill for %d", ti.Name, len(data), ti.Size())
		}
		if _, err := fh.WriteAt(data, l.TensorOffset(i)); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

type ggufCase struct {
	name    string
	edit    ggufEdit
	deep    bool
	verdict Verdict
	missing []string
	problem string
	message string
}

func TestGeneratedGGUF(t *testing.T) {
	isHead := func(n string) bool { return strings.HasPrefix(n, "blk.4.") }
	const key = "qwen35.nextn_predict_layers"
	f16 := func(mod func([]byte)) func(int64) []byte {
		return func(n int64) []byte { b := healthy(quant.F16, n); mod(b); return b }
	}
	cases := []ggufCase{
		{name: "reference layout rewritten: ok", verdict: OK},
		{name: "nextn key but tensors stripped", verdict: Dropped,
			edit:    ggufEdit{tensors: dropTensors(isHead)},
			message: "without --no-mtp"},
		{name: "tensors but no nextn key", verdict: Inconsistent,
			edit:    ggufEdit{kvs: dropKV(key)},
			message: "there is no qwen35.nextn_predict_layers key"},
		{name: "tensors but no key, block_count lowered", verdict: Inconsistent,
			edit:    ggufEdit{kvs: chainKV(dropKV(key), setKV("qwen35.block_count", gguf.U32("qwen35.block_count", 4)))},
			problem: "block 4 is past qwen35.block_count = 4"},
		{name: "converted with --no-mtp: absent", verdict: Absent,
			edit: ggufEdit{kvs: chainKV(dropKV(key), setKV("qwen35.block_count", gguf.U32("qwen35.block_count", 4))), tensors: dropTensors(isHead)}},
		{name: "nextn enorm missing", verdict: Partial,
			edit:    ggufEdit{tensors: dropTensors(func(n string) bool { return n == "blk.4.nextn.enorm.weight" })},
			missing: []string{"blk.4.nextn.enorm.weight"}},
		{name: "head block lacks attn_v", verdict: Partial,
			edit:    ggufEdit{tensors: dropTensors(func(n string) bool { return n == "blk.4.attn_v.weight" })},
			missing: []string{"blk.4.attn_v.weight"}},
		{name: "eh_proj dims", verdict: Inconsistent,
			edit:    ggufEdit{tensors: retype("blk.4.nextn.eh_proj.weight", quant.F16, 256, 256)},
			problem: "blk.4.nextn.eh_proj.weight: dims [256 256], want [512 256]"},
		{name: "head ffn differs from trunk", verdict: Inconsistent,
			edit:    ggufEdit{tensors: retype("blk.4.ffn_up.weight", quant.F16, 256, 256)},
			problem: "blk.4.ffn_up.weight: dims [256 256], but trunk block 3 has [256 512]"},
		{name: "block_count one too many", verdict: Inconsistent,
			edit:    ggufEdit{kvs: setKV("qwen35.block_count", gguf.U32("qwen35.block_count", 6))},
			problem: "is in block 4, a trunk block"},
		{name: "two layers promised, one present", verdict: Partial,
			edit: ggufEdit{kvs: chainKV(setKV(key, gguf.U32(key, 2)), setKV("qwen35.block_count", gguf.U32("qwen35.block_count", 6)))}},
		{name: "quantized head types accepted", verdict: OK,
			edit: ggufEdit{tensors: func(ts []gguf.TensorSpec) []gguf.TensorSpec {
				ts = retype("blk.4.attn_q.weight", quant.Q8_0)(ts)
				ts = retype("blk.4.ffn_up.weight", quant.Q4_K)(ts)
				return retype("blk.4.nextn.eh_proj.weight", quant.Q6_K)(ts)
			}}},
		{name: "norm quantized", verdict: Inconsistent,
			edit:    ggufEdit{tensors: retype("blk.4.nextn.hnorm.weight", quant.Q8_0)},
			problem: "a norm stored as Q8_0"},
		// --deep.
		{name: "deep: healthy F16/F32 head", deep: true, verdict: OK, edit: ggufEdit{fillHead: true}},
		{name: "deep: zero-filled tensor", deep: true, verdict: Inconsistent,
			edit:    ggufEdit{fillHead: true, fill: map[string]func(int64) []byte{"blk.4.attn_k.weight": func(n int64) []byte { return make([]byte, n) }}},
			problem: "blk.4.attn_k.weight: all zeros"},
		{name: "deep: Inf in F16", deep: true, verdict: Inconsistent,
			edit: ggufEdit{fillHead: true, fill: map[string]func(int64) []byte{
				"blk.4.attn_output.weight": f16(func(b []byte) { binary.LittleEndian.PutUint16(b[2*1000:], 0x7C00) }),
			}},
			problem: "blk.4.attn_output.weight: non-finite value at byte offset"},
		{name: "deep: quantized head healthy", deep: true, verdict: OK,
			edit: ggufEdit{fillHead: true, tensors: func(ts []gguf.TensorSpec) []gguf.TensorSpec {
				ts = retype("blk.4.attn_q.weight", quant.Q8_0)(ts)
				ts = retype("blk.4.ffn_up.weight", quant.Q4_K)(ts)
				return retype("blk.4.nextn.eh_proj.weight", quant.Q6_K)(ts)
			}}},
		{name: "deep: Q8_0 with zero quants", deep: true, verdict: Inconsistent,
			edit: ggufEdit{fillHead: true, tensors: retype("blk.4.attn_q.weight", quant.Q8_0),
				fill: map[string]func(int64) []byte{"blk.4.attn_q.weight": func(n int64) []byte {
					b := make([]byte, n)
					for u := 0; u < len(b); u += 34 {
						binary.LittleEndian.PutUint16(b[u:], 0x3C00) // d = 1, every q = 0
					}
					return b
				}}},
			problem: "blk.4.attn_q.weight: all zeros"},
		{name: "deep: Q4_K with a NaN super-block scale", deep: true, verdict: Inconsistent,
			edit: ggufEdit{fillHead: true, tensors: retype("blk.4.ffn_up.weight", quant.Q4_K),
				fill: map[string]func(int64) []byte{"blk.4.ffn_up.weight": func(n int64) []byte {
					b := healthy(quant.Q4_K, n)
					binary.LittleEndian.PutUint16(b[144*7+2:], 0x7E00) // dmin of block 7
					return b
				}}},
			problem: "blk.4.ffn_up.weight: non-finite scale at byte offset"},
		{name: "deep: Q6_K with zero scales", deep: true, verdict: Inconsistent,
			edit: ggufEdit{fillHead: true, tensors: retype("blk.4.nextn.eh_proj.weight", quant.Q6_K),
				fill: map[string]func(int64) []byte{"blk.4.nextn.eh_proj.weight": func(n int64) []byte {
					b := healthy(quant.Q6_K, n)
					for u := 0; u < len(b); u += 210 {
						binary.LittleEndian.PutUint16(b[u+208:], 0)
					}
					return b
				}}},
			problem: "blk.4.nextn.eh_proj.weight: all zeros"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeGGUF(t, c.edit)
			r, err := MTP(path, Options{Deep: c.deep})
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != c.verdict || r.Format != FormatGGUF {
				t.Fatalf("verdict %s, want %s\n%s", r.Verdict, c.verdict, describe(r))
			}
			if c.missing != nil && !slices.Equal(r.Missing, c.missing) {
				t.Errorf("missing %v, want %v", r.Missing, c.missing)
			}
			if c.problem != "" && !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, c.problem) }) {
				t.Errorf("no problem contains %q\n%s", c.problem, describe(r))
			}
			if c.message != "" && !strings.Contains(r.Message, c.message) {
				t.Errorf("message %q lacks %q", r.Message, c.message)
			}
			if !c.deep && r.BytesRead != 0 {
				t.Errorf("read tensor bytes without --deep")
			}
		})
	}
}

// TestGGUFDeepOffset pins the byte offset a deep failure names.
func TestGGUFDeepOffset(t *testing.T) {
	path := writeGGUF(t, ggufEdit{fillHead: true, tensors: retype("blk.4.ffn_up.weight", quant.Q4_K),
		fill: map[string]func(int64) []byte{"blk.4.ffn_up.weight": func(n int64) []byte {
			b := healthy(quant.Q4_K, n)
			binary.LittleEndian.PutUint16(b[144*7:], 0xFC00) // d = -Inf in block 7
			return b
		}}})
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ti, _ := f.Tensor("blk.4.ffn_up.weight")
	want := f.DataOffset + int64(ti.Offset) + 144*7
	r, err := MTP(path, Options{Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	wantText := "non-finite scale at byte offset " + strconv.FormatInt(want, 10)
	if !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, wantText) }) {
		t.Fatalf("want %q in %v", wantText, r.Problems)
	}
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r     io.ReaderAt
	n     atomic.Int64
	calls atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	c.calls.Add(1)
	return n, err
}

// sparse50GB writes a 50 GB sparse GGUF whose header is the reference
// qwen35 F16 header with the vocabulary dimension of token_embd and output
// scaled up (every other tensor, the MTP block included, unchanged), and
// returns its path and size.
func sparse50GB(t testing.TB) (string, int64) {
	t.Helper()
	const target = 50_000_000_000
	ref := refGGUF(t)
	specs := make([]gguf.TensorSpec, len(ref.Tensors))
	var rest int64
	for i, ti := range ref.Tensors {
		specs[i] = gguf.TensorSpec{Name: ti.Name, Dims: slices.Clone(ti.Dims), Type: ti.Type}
		if ti.Name != "token_embd.weight" && ti.Name != "output.weight" {
			rest += ti.Size()
		}
	}
	// token_embd and output: F16 [256, V] each, 512·V bytes.
	v := uint64((target - rest) / (2 * 512))
	for i := range specs {
		if specs[i].Name == "token_embd.weight" || specs[i].Name == "output.weight" {
			specs[i].Dims[1] = v
		}
	}
	l, err := gguf.PlanLayout(ref.KVs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sparse-50GB.gguf")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.Write(l.Header); err != nil {
		t.Fatal(err)
	}
	if err := fh.Truncate(l.Size); err != nil {
		t.Skipf("this filesystem cannot hold a %d-byte sparse file: %v", l.Size, err)
	}
	return path, l.Size
}

// TestSparse50GB: verifying a 50 GB GGUF reads its header only (< 1 MB),
// and the verdict is the reference's.
func TestSparse50GB(t *testing.T) {
	path, size := sparse50GB(t)
	if size < 50_000_000_000 {
		t.Fatalf("size %d", size)
	}
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	cr := &countingReaderAt{r: fh}
	r, err := GGUF(cr, size, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != OK {
		t.Fatalf("%s", describe(r))
	}
	if n := cr.n.Load(); n >= 1<<20 {
		t.Fatalf("read %d bytes of a %d-byte file, want < 1 MiB", n, size)
	}
	t.Logf("read %d bytes in %d calls of a %d-byte file", cr.n.Load(), cr.calls.Load(), size)
}

// BenchmarkMTPGGUF verifies the reference qwen35 F16 GGUF (7.4 MB, the
// anchor) and a 50 GB sparse GGUF with the same header layout: the time and
// bytes read must not grow with the file.
func BenchmarkMTPGGUF(b *testing.B) {
	anchor := materializeGGUF(b, "qwen35-base-F16.gguf")
	big, _ := sparse50GB(b)
	for _, bc := range []struct{ name, path string }{{"size=7MB", anchor}, {"size=50GB", big}} {
		b.Run(bc.name, func(b *testing.B) {
			fh, err := os.Open(bc.path)
			if err != nil {
				b.Fatal(err)
			}
			defer fh.Close()
			st, _ := fh.Stat()
			cr := &countingReaderAt{r: fh}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := GGUF(cr, st.Size(), bc.path, Options{})
				if err != nil || r.Verdict != OK {
					b.Fatalf("%v %v", err, r)
				}
			}
			b.StopTimer()
			read := cr.n.Load() / int64(b.N)
			b.ReportMetric(float64(read), "bytes-read/op")
			b.ReportMetric(float64(st.Size()), "file-bytes")
			if read >= 1<<20 {
				b.Fatalf("read %d bytes per verify, want < 1 MiB", read)
			}
		})
	}
}

// miniArch builds a small GGUF for arch from per-block tensor lists: trunk
// blocks 0..len(trunk)-1, then the head block(s) with nextn tensors.
func miniArch(t *testing.T, arch string, kvs []gguf.KV, global []gguf.TensorSpec, blocks [][]gguf.TensorSpec, edit func([]gguf.TensorSpec) []gguf.TensorSpec) string {
	t.Helper()
	var specs []gguf.TensorSpec
	specs = append(specs, global...)
	for b, bl := range blocks {
		for _, s := range bl {
			s.Name = "blk." + strconv.Itoa(b) + "." + s.Name
			specs = append(specs, s)
		}
	}
	if edit != nil {
		specs = edit(specs)
	}
	all := append([]gguf.KV{gguf.Str("general.architecture", arch)}, kvs...)
	l, err := gguf.PlanLayout(all, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), arch+".gguf")
	fh, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	fh.Write(l.Header)
	if err := fh.Truncate(l.Size); err != nil {
		t.Fatal(err)
	}
	return path
}

func spec(name string, ty quant.Type, dims ...uint64) gguf.TensorSpec {
	return gguf.TensorSpec{Name: name, Dims: dims, Type: ty}
}

// qwen35moeBlock is a full-attention MoE block as llama.cpp's qwen35moe
// loader names it (llamacpp.md §4.4): H=64, 2 heads of 32 (q doubled for
// the gate), 1 KV head, 4 experts of 32, shared expert 32.
func qwen35moeBlock() []gguf.TensorSpec {
	const H, E, I = 64, 4, 32
	return []gguf.TensorSpec{
		spec("attn_norm.weight", quant.F32, H),
		spec("attn_q.weight", quant.F16, H, 2*2*32),
		spec("attn_k.weight", quant.F16, H, 32),
		spec("attn_v.weight", quant.F16, H, 32),
		spec("attn_output.weight", quant.F16, 2*32, H),
		spec("attn_q_norm.weight", quant.F32, 32),
		spec("attn_k_norm.weight", quant.F32, 32),
		spec("post_attention_norm.weight", quant.F32, H),
		spec("ffn_gate_inp.weight", quant.F32, H, E),
		spec("ffn_gate_exps.weight", quant.F16, H, I, E),
		spec("ffn_up_exps.weight", quant.F16, H, I, E),
		spec("ffn_down_exps.weight", quant.F16, I, H, E),
		spec("ffn_gate_inp_shexp.weight", quant.F32, H),
		spec("ffn_gate_shexp.weight", quant.F16, H, I),
		spec("ffn_up_shexp.weight", quant.F16, H, I),
		spec("ffn_down_shexp.weight", quant.F16, I, H),
	}
}

func nextnTensors(h, v uint64, full bool) []gguf.TensorSpec {
	out := []gguf.TensorSpec{
		spec("nextn.eh_proj.weight", quant.F16, 2*h, h),
		spec("nextn.enorm.weight", quant.F32, h),
		spec("nextn.hnorm.weight", quant.F32, h),
		spec("nextn.shared_head_norm.weight", quant.F32, h),
	}
	if full {
		out = append(out, spec("nextn.embed_tokens.weight", quant.F16, h, v), spec("nextn.shared_head_head.weight", quant.F16, h, v))
	}
	return out
}

// deepseek2Block is an MLA block (deepseek2 arch), MoE or dense.
func deepseek2Block(moe bool) []gguf.TensorSpec {
	const H, E, I = 64, 4, 32
	out := []gguf.TensorSpec{
		spec("attn_norm.weight", quant.F32, H),
		spec("attn_q_a.weight", quant.F16, H, 32),
		spec("attn_q_a_norm.weight", quant.F32, 32),
		spec("attn_q_b.weight", quant.F16, 32, 2*24),
		spec("attn_kv_a_mqa.weight", quant.F16, H, 16+8),
		spec("attn_kv_a_norm.weight", quant.F32, 16),
		spec("attn_kv_b.weight", quant.F16, 16, 2*32),
		spec("attn_output.weight", quant.F16, 2*16, H),
		spec("ffn_norm.weight", quant.F32, H),
	}
	if !moe {
		return append(out, spec("ffn_gate.weight", quant.F16, H, 128), spec("ffn_up.weight", quant.F16, H, 128), spec("ffn_down.weight", quant.F16, 128, H))
	}
	return append(out,
		spec("ffn_gate_inp.weight", quant.F32, H, E),
		spec("exp_probs_b.bias", quant.F32, E),
		spec("ffn_gate_exps.weight", quant.F16, H, I, E),
		spec("ffn_up_exps.weight", quant.F16, H, I, E),
		spec("ffn_down_exps.weight", quant.F16, I, H, E),
		spec("ffn_gate_shexp.weight", quant.F16, H, I),
		spec("ffn_up_shexp.weight", quant.F16, H, I),
		spec("ffn_down_shexp.weight", quant.F16, I, H),
	)
}

func TestGGUFFamilies(t *testing.T) {
	const H, V = 64, 128
	global := []gguf.TensorSpec{spec("token_embd.weight", quant.F16, H, V), spec("output_norm.weight", quant.F32, H)}
	moeKVs := []gguf.KV{gguf.U32("qwen35moe.block_count", 2), gguf.U32("qwen35moe.embedding_length", H), gguf.U32("qwen35moe.nextn_predict_layers", 1)}
	moeBlocks := func() [][]gguf.TensorSpec {
		return [][]gguf.TensorSpec{qwen35moeBlock(), append(qwen35moeBlock(), nextnTensors(H, V, false)...)}
	}
	dsKVs := []gguf.KV{gguf.U32("deepseek2.block_count", 3), gguf.U32("deepseek2.embedding_length", H), gguf.U32("deepseek2.nextn_predict_layers", 1)}
	dsBlocks := func(full bool) [][]gguf.TensorSpec {
		return [][]gguf.TensorSpec{deepseek2Block(false), deepseek2Block(true), append(deepseek2Block(true), nextnTensors(H, V, full)...)}
	}
	cases := []struct {
		name     string
		path     func(t *testing.T) string
		verdict  Verdict
		expected int
		missing  []string
		problem  string
	}{
		{"qwen35moe ok", func(t *testing.T) string { return miniArch(t, "qwen35moe", moeKVs, global, moeBlocks(), nil) }, OK, 20, nil, ""},
		{"qwen35moe head lost its shared-expert gate", func(t *testing.T) string {
			return miniArch(t, "qwen35moe", moeKVs, global, moeBlocks(), dropTensors(func(n string) bool { return n == "blk.1.ffn_gate_inp_shexp.weight" }))
		}, Partial, 20, []string{"blk.1.ffn_gate_inp_shexp.weight"}, ""},
		{"qwen35moe head has fewer experts", func(t *testing.T) string {
			return miniArch(t, "qwen35moe", moeKVs, global, moeBlocks(), retype("blk.1.ffn_down_exps.weight", quant.F16, 32, 64, 3))
		}, Inconsistent, 20, nil, "blk.1.ffn_down_exps.weight: dims [32 64 3], but trunk block 0 has [32 64 4]"},
		{"deepseek2 nextn with embed_tokens and shared_head_head ok", func(t *testing.T) string {
			return miniArch(t, "deepseek2", dsKVs, global, dsBlocks(true), nil)
		}, OK, 23, nil, ""},
		{"deepseek2 without the optional nextn tensors ok", func(t *testing.T) string {
			return miniArch(t, "deepseek2", dsKVs, global, dsBlocks(false), nil)
		}, OK, 21, nil, ""},
		{"deepseek2 nextn.embed_tokens of the wrong vocabulary", func(t *testing.T) string {
			return miniArch(t, "deepseek2", dsKVs, global, dsBlocks(true), retype("blk.2.nextn.embed_tokens.weight", quant.F16, H, 256))
		}, Inconsistent, 23, nil, "blk.2.nextn.embed_tokens.weight: dims [64 256], want [64 128]"},
		{"deepseek2 MTP block dense while the trunk's last block is MoE", func(t *testing.T) string {
			blocks := dsBlocks(false)
			blocks[2] = append(deepseek2Block(false), nextnTensors(H, V, false)...)
			return miniArch(t, "deepseek2", dsKVs, global, blocks, nil)
		}, Partial, 24, nil, "blk.2.ffn_gate.weight: not in trunk block 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			r, err := MTP(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if h := headOf(t, path); h.NextNTensors != r.Present {
				t.Errorf("FindGGUFHead counts %d head tensors, MTP %d", h.NextNTensors, r.Present)
			}
			if r.Verdict != c.verdict || r.Expected != c.expected {
				t.Fatalf("verdict %s expected %d, want %s %d\n%s", r.Verdict, r.Expected, c.verdict, c.expected, describe(r))
			}
			if c.missing != nil && !slices.Equal(r.Missing, c.missing) {
				t.Errorf("missing %v, want %v", r.Missing, c.missing)
			}
			if c.problem != "" && !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, c.problem) }) {
				t.Errorf("no problem contains %q\n%s", c.problem, describe(r))
			}
		})
	}
}

// An mmproj (the reference's --mmproj output) is not a model that could
// carry a head: verdict not_applicable, which passes, with Require too,
// and says so; nothing is read past the header, with Deep too.
func TestMMProjNotApplicable(t *testing.T) {
	const path = "../gguf/convert/testdata/qwen35vl/mmproj-base-F16.gguf"
	for _, opts := range []Options{{}, {Require: true, Deep: true}} {
		r, err := Check(path, path, opts)
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict != NotApplicable || !r.Pass || r.Reason != "" || r.BytesRead != 0 {
			t.Errorf("%+v: verdict %s, pass %v, reason %q, read %d", opts, r.Verdict, r.Pass, r.Reason, r.BytesRead)
		}
		if !strings.HasPrefix(r.Message, "not applicable: mmproj (vision tower): qwen3vl_merger projector, 2 blocks of 64") {
			t.Errorf("message %q", r.Message)
		}
		if r.MMProj == nil || r.MMProj.ProjectionDim != 256 || r.Arch != "clip" {
			t.Errorf("mmproj %+v, arch %q", r.MMProj, r.Arch)
		}
		if s := Summarize(opts, []Result{r}); !s.Pass {
			t.Error("a run over an mmproj alone fails")
		}
	}
}
