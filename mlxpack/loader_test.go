package mlxpack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// This file mirrors, for tests only, what mlx-lm's load_model does with an
// MLX directory (../shared/notes/mlx.md §1), in 0.32.0 (d78bf58e) and in
// the releases before it up to v0.31.3, which differ in one rule (below):
// it builds the model's
// parameter tree from config.json alone (qwen3 and qwen3_5 dense, the
// classes of mlx_lm/models/qwen3.py and qwen3_5.py), runs the load-time
// sanitize, decides per Linear/Embedding whether it is quantized (a
// per-module entry of "quantization" wins, else whether P.scales is among
// the weights), and then checks load_weights(strict=True): no missing and
// no extra parameter, every shape as the module expects. It also checks
// what load_weights does not but quantized_matmul needs: U32 packed
// weights, float scales and biases.

type loaderModule struct {
	path      string
	shape     []int64 // weight shape [out, in] (or a parameter's shape)
	quantable bool    // nn.Linear or nn.Embedding
	param     string  // "weight", or the bare parameter's name
}

type loaderCfg struct {
	ModelType         string `json:"model_type"`
	Hidden            int64  `json:"hidden_size"`
	Inter             int64  `json:"intermediate_size"`
	Layers            int64  `json:"num_hidden_layers"`
	Heads             int64  `json:"num_attention_heads"`
	KVHeads           int64  `json:"num_key_value_heads"`
	HeadDim           int64  `json:"head_dim"`
	Vocab             int64  `json:"vocab_size"`
	Tied              bool   `json:"tie_word_embeddings"`
	FullAttnInterval  int64  `json:"full_attention_interval"`
	LinKeyHeads       int64  `json:"linear_num_key_heads"`
	LinValueHeads     int64  `json:"linear_num_value_heads"`
	LinKeyDim         int64  `json:"linear_key_head_dim"`
	LinValueDim       int64  `json:"linear_value_head_dim"`
	ConvKernel        int64  `json:"linear_conv_kernel_dim"`
	RopeTheta         any    `json:"rope_theta"`
	Quantization      map[string]json.RawMessage
	QuantizationConfg map[string]any `json:"quantization_config"`
}

// loaderModules lists the model's parameters as mlx-lm builds them.
func loaderModules(t *testing.T, c loaderCfg) []loaderModule {
	t.Helper()
	var ms []loaderModule
	lin := func(p string, out, in int64) { ms = append(ms, loaderModule{p, []int64{out, in}, true, "weight"}) }
	vec := func(p string, n int64) { ms = append(ms, loaderModule{p, []int64{n}, false, "weight"}) }
	bare := func(p, name string, shape ...int64) { ms = append(ms, loaderModule{p, shape, false, name}) }
	H := c.Hidden
	switch c.ModelType {
	case "qwen3":
		if c.RopeTheta == nil {
			t.Fatal("qwen3 ModelArgs: missing required argument rope_theta")
		}
		lin("model.embed_tokens", c.Vocab, H)
		for i := int64(0); i < c.Layers; i++ {
			p := fmt.Sprintf("model.layers.%d.", i)
			lin(p+"self_attn.q_proj", c.Heads*c.HeadDim, H)
			lin(p+"self_attn.k_proj", c.KVHeads*c.HeadDim, H)
			lin(p+"self_attn.v_proj", c.KVHeads*c.HeadDim, H)
			lin(p+"self_attn.o_proj", H, c.Heads*c.HeadDim)
			vec(p+"self_attn.q_norm", c.HeadDim)
			vec(p+"self_attn.k_norm", c.HeadDim)
			lin(p+"mlp.gate_proj", c.Inter, H)
			lin(p+"mlp.down_proj", H, c.Inter)
			lin(p+"mlp.up_proj", c.Inter, H)
			vec(p+"input_layernorm", H)
			vec(p+"post_attention_layernorm", H)
		}
		vec("model.norm", H)
		if !c.Tied {
			lin("lm_head", c.Vocab, H)
		}
	case "qwen3_5":
		lin("language_model.model.embed_tokens", c.Vocab, H)
		keyDim, valDim := c.LinKeyDim*c.LinKeyHeads, c.LinValueDim*c.LinValueHeads
		conv := 2*keyDim + valDim
		for i := int64(0); i < c.Layers; i++ {
			p := fmt.Sprintf("language_model.model.layers.%d.", i)
			if (i+1)%c.FullAttnInterval != 0 {
				bare(p+"linear_attn.conv1d", "weight", conv, c.ConvKernel, 1)
				lin(p+"linear_attn.in_proj_qkv", conv, H)
				lin(p+"linear_attn.in_proj_z", valDim, H)
				lin(p+"linear_attn.in_proj_b", c.LinValueHeads, H)
				lin(p+"linear_attn.in_proj_a", c.LinValueHeads, H)
				bare(p+"linear_attn", "dt_bias", c.LinValueHeads)
				bare(p+"linear_attn", "A_log", c.LinValueHeads)
				vec(p+"linear_attn.norm", c.LinValueDim)
				lin(p+"linear_attn.out_proj", H, valDim)
			} else {
				lin(p+"self_attn.q_proj", c.Heads*c.HeadDim*2, H)
				lin(p+"self_attn.k_proj", c.KVHeads*c.HeadDim, H)
				lin(p+"self_attn.v_proj", c.KVHeads*c.HeadDim, H)
				lin(p+"self_attn.o_proj", H, c.Heads*c.HeadDim)
				vec(p+"self_attn.q_norm", c.HeadDim)
				vec(p+"self_attn.k_norm", c.HeadDim)
			}
			vec(p+"input_layernorm", H)
			vec(p+"post_attention_layernorm", H)
			lin(p+"mlp.gate_proj", c.Inter, H)
			lin(p+"mlp.down_proj", H, c.Inter)
			lin(p+"mlp.up_proj", c.Inter, H)
		}
		vec("language_model.model.norm", H)
		if !c.Tied {
			lin("language_model.lm_head", c.Vocab, H)
		}
	default:
		t.Fatalf("Model type %s not supported.", c.ModelType)
	}
	return ms
}

type loadedTensor struct {
	dtype tensor.DType
	shape []int64
}

// The mlx-lm versions the mirror knows. They differ in qwen3_5's
// load-time norm shift: v0.31.3 (and every release from PR #869 on) adds
// 1.0 to the zero-centred norms when conv1d is in HF layout OR any "mtp."
// key is among the weights loaded; 0.32.0 (PR #1623) only for the conv1d
// layout. Run on an MLX-layout directory (norms shifted already) with mtp.*
// keys in model*.safetensors, v0.31.3 shifts them twice: it loads, and
// computes garbage (the recorded run in testdata/mlx_sidefile shows it).
var mlxlmVersions = []string{"0.31.3", "0.32.0"}

// checkLoads applies the loader's rules, of every version, to the MLX
// directory dir.
func checkLoads(t *testing.T, dir string) {
	t.Helper()
	for _, v := range mlxlmVersions {
		for _, p := range loaderProblems(t, dir, v) {
			t.Errorf("mlx-lm %s: %s", v, p)
		}
	}
}

// loaderProblems lists what keeps dir from loading in mlx-lm version, or
// from computing what it holds.
func loaderProblems(t *testing.T, dir, version string) []string {
	t.Helper()
	var problems []string
	errorf := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var c loaderCfg
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "config.json")), &c); err != nil {
		t.Fatal(err)
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	// load_model: model*.safetensors only, the index is not read.
	weights := map[string]loadedTensor{}
	files, _ := filepath.Glob(filepath.Join(dir, "model*.safetensors"))
	for _, path := range files {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range f.Tensors {
			if _, dup := weights[ti.Name]; dup {
				errorf("%s: tensor %s in two files", path, ti.Name)
			}
			weights[ti.Name] = loadedTensor{ti.DType, ti.Shape}
		}
		f.Close()
	}
	// The load-time sanitize (qwen3_5: "mtp." keys are discarded; the
	// norms shifted as the version decides, which is only right when they
	// are not shifted yet: conv1d in HF layout [C,1,K]).
	if c.ModelType == "qwen3_5" {
		hasMTP, hfConv := false, false
		for k, w := range weights {
			if strings.Contains(k, "mtp.") {
				hasMTP = true
				delete(weights, k)
			}
			if strings.Contains(k, "conv1d.weight") && len(w.shape) == 3 && w.shape[2] != 1 {
				hfConv = true
			}
		}
		shift := hfConv || (version == "0.31.3" && hasMTP)
		if shift && !hfConv {
			errorf("every norm shifted by +1 a second time (mtp.* keys in model*.safetensors of a directory in MLX layout): silent garbage")
		}
	}
	type qp struct{ bits, gs int64 }
	var global qp
	if c.Quantization != nil {
		json.Unmarshal(c.Quantization["bits"], &global.bits)
		json.Unmarshal(c.Quantization["group_size"], &global.gs)
	}
	expected := map[string]bool{}
	for _, m := range loaderModules(t, c) {
		name := m.path + "." + m.param
		expected[name] = true
		quant := false
		q := global
		if m.quantable && c.Quantization != nil {
			if raw, ok := c.Quantization[m.path]; ok {
				var entry map[string]any
				if string(raw) != "false" {
					if err := json.Unmarshal(raw, &entry); err != nil {
						t.Fatalf("quantization[%s] = %s", m.path, raw)
					}
					quant = true
					if v, ok := entry["bits"].(float64); ok {
						q.bits = int64(v)
					}
					if v, ok := entry["group_size"].(float64); ok {
						q.gs = int64(v)
					}
				}
			} else {
				_, quant = weights[m.path+".scales"]
			}
		}
		got, ok := weights[name]
		if !ok {
			errorf("missing parameter %s", name)
			continue
		}
		if !quant {
			if !sameShape(got.shape, m.shape) || !isFloat(got.dtype) {
				errorf("%s: %s %v, the model expects a float %v", name, got.dtype, got.shape, m.shape)
			}
			continue
		}
		out, in := m.shape[0], m.shape[1]
		expected[m.path+".scales"] = true
		expected[m.path+".biases"] = true
		if got.dtype != tensor.U32 || !sameShape(got.shape, []int64{out, in * q.bits / 32}) {
			errorf("%s: %s %v, QuantizedLinear(%d bits) expects U32 %v", name, got.dtype, got.shape, q.bits, []int64{out, in * q.bits / 32})
		}
		for _, s := range []string{".scales", ".biases"} {
			st, ok := weights[m.path+s]
			if !ok {
				errorf("missing parameter %s%s", m.path, s)
				continue
			}
			if !isFloat(st.dtype) || !sameShape(st.shape, []int64{out, in / q.gs}) {
				errorf("%s%s: %s %v, want float %v", m.path, s, st.dtype, st.shape, []int64{out, in / q.gs})
			}
		}
	}
	var extra []string
	for k := range weights {
		if !expected[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		errorf("Received %d parameters not in model: %s", len(extra), strings.Join(extra, ", "))
	}
	return problems
}

func sameShape(a, b []int64) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

func isFloat(d tensor.DType) bool { return d == tensor.BF16 || d == tensor.F16 || d == tensor.F32 }

// TestLoaderAcceptsOutputs: every output of the tiny Qwen3 and Qwen3.5
// references loads by the loader's rules (and each mutation of one
// breaks it, so the check is not vacuous).
func TestLoaderAcceptsOutputs(t *testing.T) {
	cases := []struct {
		name string
		src  string
		opts QuantizeOptions
	}{
		{"qwen3-float", qwen3Base, QuantizeOptions{}},
		{"qwen3-f16", qwen3Base, QuantizeOptions{DType: "f16"}},
		{"qwen3-g64-b4", qwen3Base, QuantizeOptions{Bits: 4, GroupSize: 64}},
		{"qwen3-g128-b3", qwen3Base, QuantizeOptions{Bits: 3, GroupSize: 128}},
		{"qwen3-mixed_3_6", qwen3Base, QuantizeOptions{Bits: 3, GroupSize: 64, Recipe: "mixed_3_6"}},
		{"qwen35-g64-b4", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64}},
		{"qwen35-g32-b6", qwen35Base, QuantizeOptions{Bits: 6, GroupSize: 32}},
		{"qwen35-g64-b4-keep-mtp", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}},
		{"qwen35-mixed_2_6", qwen35Base, QuantizeOptions{Bits: 2, GroupSize: 64, Recipe: "mixed_2_6"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "mlx")
			convertTo(t, tc.src, out, tc.opts, QuantizeRunOptions{Jobs: 2})
			checkLoads(t, out)
		})
	}
}

// TestLoaderMirrorRejects: the mirror refuses what mlx-lm refuses.
func TestLoaderMirrorRejects(t *testing.T) {
	good := filepath.Join(t.TempDir(), "mlx")
	convertTo(t, qwen35Base, good, QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 1})
	mutations := map[string]func(t *testing.T, dir string){
		"module forced float": func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) {
				c["quantization"].(map[string]any)["language_model.model.layers.0.mlp.up_proj"] = false
			})
		},
		"tied head": func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["tie_word_embeddings"] = true })
		},
		"other group size": func(t *testing.T, dir string) {
			editConfig(t, dir, func(c map[string]any) { c["quantization"].(map[string]any)["group_size"] = 32 })
		},
		"stray weights file": func(t *testing.T, dir string) {
			w, err := safetensors.Create(filepath.Join(dir, "model-extra.safetensors"), nil, []safetensors.TensorSpec{{Name: "language_model.model.extra.weight", DType: tensor.BF16, Shape: []int64{2}}})
			if err != nil {
				t.Fatal(err)
			}
			w.Write(make([]byte, 4))
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "mlx")
			copyTree(t, good, dir)
			mutate(t, dir)
			if p := loaderProblems(t, dir, "0.32.0"); len(p) == 0 {
				t.Error("the mutated directory passes the loader mirror")
			}
		})
	}
}

func editConfig(t *testing.T, dir string, f func(map[string]any)) {
	t.Helper()
	var c map[string]any
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "config.json")), &c); err != nil {
		t.Fatal(err)
	}
	f(c)
	b, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.WriteFile(filepath.Join(dst, e.Name()), mustRead(t, filepath.Join(src, e.Name())), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLoaderMirrorMTPInModel: the one rule the versions differ in. The same
// head moved into a file mlx-lm reads (model-mtp.safetensors matches
// model*.safetensors) is garbage to v0.31.3 and fine to 0.32.0; where ferry
// keeps it, both load the trunk alone.
func TestLoaderMirrorMTPInModel(t *testing.T) {
	kept := filepath.Join(t.TempDir(), "mlx")
	convertTo(t, qwen35Base, kept, QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}, QuantizeRunOptions{Jobs: 1})
	for _, v := range mlxlmVersions {
		if p := loaderProblems(t, kept, v); len(p) > 0 {
			t.Errorf("ferry's layout, mlx-lm %s: %v", v, p)
		}
	}
	moved := filepath.Join(t.TempDir(), "mlx")
	copyTree(t, kept, moved)
	if err := os.Rename(filepath.Join(moved, "mtp.safetensors"), filepath.Join(moved, "model-mtp.safetensors")); err != nil {
		t.Fatal(err)
	}
	if p := loaderProblems(t, moved, "0.31.3"); len(p) != 1 || !strings.Contains(p[0], "a second time") {
		t.Errorf("mtp.* in model*.safetensors, mlx-lm 0.31.3: %v, want the double shift", p)
	}
	if p := loaderProblems(t, moved, "0.32.0"); len(p) > 0 {
		t.Errorf("mtp.* in model*.safetensors, mlx-lm 0.32.0: %v", p)
	}
}
