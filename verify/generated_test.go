package verify

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/tensor"
)

type writer interface {
	Write(dir string) (*testmodel.Model, error)
}

func gen(t testing.TB, w writer) string {
	t.Helper()
	m, err := w.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return m.Dir
}

// ckCase is one generated checkpoint and what verify must say about it.
type ckCase struct {
	name    string
	build   func(t *testing.T) string
	verdict Verdict
	conv    Convention
	format  Format
	// missing, if set, is exactly Report.Missing; problem, if set, must
	// appear in one of Report.Problems; message in Report.Message.
	missing []string
	problem string
	message string
	warning string
	deep    bool
}

func setKey(k string, v any) func(map[string]any) {
	return func(c map[string]any) { c[k] = v }
}

func delKey(k string) func(map[string]any) {
	return func(c map[string]any) { delete(c, k) }
}

// dup writes every tensor under from also under to.
func dup(from, to string) func(string, tensor.DType, []int64) []outTensor {
	return func(name string, dt tensor.DType, shape []int64) []outTensor {
		out := keep(name, dt, shape)
		if strings.HasPrefix(name, from) {
			out = append(out, outTensor{name: to + strings.TrimPrefix(name, from), dtype: dt, shape: shape})
		}
		return out
	}
}

// reshape gives one tensor a new shape (with pattern data).
func reshape(target string, shape ...int64) func(string, tensor.DType, []int64) []outTensor {
	return func(name string, dt tensor.DType, s []int64) []outTensor {
		if name != target {
			return keep(name, dt, s)
		}
		n, _ := tensor.ByteSize(dt, shape)
		return []outTensor{{name: name, dtype: dt, shape: shape, data: pattern(n)}}
	}
}

// refill replaces one tensor's bytes.
func refill(target string, data func(n int64) []byte) func(string, tensor.DType, []int64) []outTensor {
	return func(name string, dt tensor.DType, s []int64) []outTensor {
		if name != target {
			return keep(name, dt, s)
		}
		return []outTensor{{name: name, dtype: dt, shape: s, data: data(numel(s))}}
	}
}

func TestGeneratedCheckpoints(t *testing.T) {
	dense := func(t *testing.T) string { return gen(t, testmodel.Qwen35Options{}) }
	moe := func(t *testing.T) string { return gen(t, testmodel.Qwen35MoEOptions{}) }
	deepseek := func(t *testing.T) string { return gen(t, testmodel.DeepSeekV3Options{}) }
	cases := []ckCase{
		// Qwen3.5 dense: mtp.* at the top level.
		{name: "qwen dense ok", build: dense, verdict: OK, conv: ConvQwen},
		{name: "qwen dense merge dropped the head", verdict: Dropped, conv: ConvQwen,
			build: func(t *testing.T) string {
				return gen(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}})
			},
			message: "ferry merge"},
		{name: "qwen dense no head", verdict: Absent,
			build: func(t *testing.T) string {
				return gen(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{NoMTP: true}})
			}},
		{name: "qwen dense partial", verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), dropIf(func(n string) bool {
					return n == "mtp.layers.0.self_attn.k_proj.weight" || n == "mtp.pre_fc_norm_hidden.weight"
				}), nil)
			},
			missing: []string{"mtp.layers.0.self_attn.k_proj.weight", "mtp.pre_fc_norm_hidden.weight"}},
		{name: "qwen dense promises two layers, has one", verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), nil, setKey("mtp_num_hidden_layers", 2))
			}, problem: ""},
		{name: "qwen dense eh_proj shape", verdict: Inconsistent, conv: ConvQwen,
			build:   func(t *testing.T) string { return rewrite(t, dense(t), reshape("mtp.fc.weight", 64, 64), nil) },
			problem: "mtp.fc.weight: shape [64 64], want [64 128]"},
		{name: "qwen dense attention shape differs from trunk", verdict: Inconsistent, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), reshape("mtp.layers.0.self_attn.q_proj.weight", 64, 64), nil)
			},
			problem: "mtp.layers.0.self_attn.q_proj.weight: shape [64 64], but trunk layer 3 has [128 64]"},
		{name: "qwen dense dtype", verdict: Inconsistent, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), func(name string, dt tensor.DType, s []int64) []outTensor {
					if name == "mtp.layers.0.mlp.up_proj.weight" {
						return []outTensor{{name: name, dtype: tensor.I16, shape: s}}
					}
					return keep(name, dt, s)
				}, nil)
			},
			problem: "dtype I16, but trunk layer 3 has BF16"},
		{name: "qwen dense tensors but no config key", verdict: Inconsistent, conv: ConvQwen,
			build:   func(t *testing.T) string { return rewrite(t, dense(t), nil, delKey("mtp_num_hidden_layers")) },
			message: "promises no MTP layers"},
		{name: "qwen dense more layers than promised", verdict: Inconsistent, conv: ConvQwen,
			build:   func(t *testing.T) string { return rewrite(t, dense(t), dup("mtp.layers.0.", "mtp.layers.1."), nil) },
			problem: "2 MTP layer(s) in the weight index but the config promises 1"},
		{name: "qwen dedicated MTP embeddings promised, missing", verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), nil, setKey("mtp_use_dedicated_embeddings", true))
			},
			missing: []string{"mtp.embed_tokens.weight"}},
		{name: "qwen dedicated MTP embeddings present", verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), nil, setKey("mtp_use_dedicated_embeddings", true),
					outTensor{name: "mtp.embed_tokens.weight", dtype: tensor.BF16, shape: []int64{512, 64}, data: filledBF16(512*64, 0.5)})
			}},
		{name: "qwen ConditionalGeneration layout ok", verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string { return gen(t, testmodel.Qwen35Options{ConditionalGeneration: true}) }},
		// Qwen3.5 MoE: experts per expert, fused, or both.
		{name: "qwen moe ok", build: moe, verdict: OK, conv: ConvQwen},
		{name: "qwen moe fused trunk, per-expert head", verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string {
				return gen(t, testmodel.Qwen35MoEOptions{MoE: testmodel.MoE{FusedExperts: true}})
			}},
		{name: "qwen moe fused trunk and head", verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string {
				return gen(t, testmodel.Qwen35MoEOptions{MoE: testmodel.MoE{FusedExperts: true, FusedMTPExperts: true}})
			}},
		{name: "qwen moe head lost experts", verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, moe(t), dropIf(func(n string) bool {
					return n == "mtp.layers.0.mlp.experts.1.gate_proj.weight" || n == "mtp.layers.0.mlp.experts.3.down_proj.weight"
				}), nil)
			},
			missing: []string{"mtp.layers.0.mlp.experts.1.gate_proj.weight", "mtp.layers.0.mlp.experts.3.down_proj.weight"}},
		{name: "qwen moe head dense while trunk is MoE", verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, moe(t), dropIf(func(n string) bool {
					return strings.HasPrefix(n, "mtp.layers.0.mlp.")
				}), nil, outTensor{name: "mtp.layers.0.mlp.up_proj.weight", dtype: tensor.BF16, shape: []int64{128, 64}, data: pattern(128 * 64 * 2)})
			},
			problem: "mtp.layers.0.mlp.up_proj.weight: not in trunk layer 3"},
		{name: "qwen3-next counted by num_nextn_predict_layers, head dropped", verdict: Dropped, conv: ConvQwen,
			build: func(t *testing.T) string {
				return rewrite(t, gen(t, testmodel.Qwen3NextOptions{}), dropIf(func(n string) bool { return strings.HasPrefix(n, "mtp.") }),
					func(c map[string]any) { delete(c, "mtp_num_hidden_layers"); c["num_nextn_predict_layers"] = 1 })
			},
			message: "num_nextn_predict_layers = 1) but no mtp.* tensor"},
		{name: "qwen3-next ok", verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string { return gen(t, testmodel.Qwen3NextOptions{}) }},
		// DeepSeek-V3: model.layers.{N}.* nextn layer.
		{name: "deepseek nextn ok", build: deepseek, verdict: OK, conv: ConvNextN},
		{name: "deepseek no nextn", verdict: Absent,
			build: func(t *testing.T) string { return gen(t, testmodel.DeepSeekV3Options{NoNextN: true}) }},
		{name: "deepseek nextn layer dropped", verdict: Dropped, conv: ConvNextN,
			build: func(t *testing.T) string {
				return rewrite(t, deepseek(t), dropIf(func(n string) bool { return strings.HasPrefix(n, "model.layers.2.") }), nil)
			},
			message: "no model.layers.2.* tensor"},
		{name: "deepseek enorm missing", verdict: Partial, conv: ConvNextN,
			build: func(t *testing.T) string {
				return rewrite(t, deepseek(t), dropIf(func(n string) bool { return n == "model.layers.2.enorm.weight" }), nil)
			},
			missing: []string{"model.layers.2.enorm.weight"}},
		{name: "deepseek eh_proj shape", verdict: Inconsistent, conv: ConvNextN,
			build: func(t *testing.T) string {
				return rewrite(t, deepseek(t), reshape("model.layers.2.eh_proj.weight", 128, 64), nil)
			},
			problem: "model.layers.2.eh_proj.weight: shape [128 64], want [64 128]"},
		{name: "deepseek layer but no key", verdict: Inconsistent, conv: ConvNextN,
			build: func(t *testing.T) string { return rewrite(t, deepseek(t), nil, delKey("num_nextn_predict_layers")) }},
		// --deep on safetensors.
		{name: "deep: zero head tensor", verdict: Inconsistent, conv: ConvQwen, deep: true,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), refill("mtp.layers.0.self_attn.o_proj.weight", func(n int64) []byte { return make([]byte, 2*n) }), nil)
			},
			problem: "mtp.layers.0.self_attn.o_proj.weight (model-00008-of-00008.safetensors): all zeros"},
		{name: "deep: NaN in a head norm", verdict: Inconsistent, conv: ConvQwen, deep: true,
			build: func(t *testing.T) string {
				return rewrite(t, dense(t), refill("mtp.norm.weight", func(n int64) []byte {
					b := filledBF16(n, 1)
					setBF16NaN(b, 5)
					return b
				}), nil)
			},
			problem: "mtp.norm.weight (model-00008-of-00008.safetensors): non-finite value at byte offset"},
		{name: "deep: healthy head", verdict: OK, conv: ConvQwen, deep: true, build: dense},
		{name: "deep: healthy deepseek head", verdict: OK, conv: ConvNextN, deep: true, build: deepseek},
	}
	runCkCases(t, cases)
}

func runCkCases(t *testing.T, cases []ckCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.build(t)
			r, err := MTP(path, Options{Deep: c.deep})
			if err != nil {
				t.Fatal(err)
			}
			format := c.format
			if format == "" {
				format = FormatSafetensors
			}
			if r.Verdict != c.verdict || r.Convention != c.conv || r.Format != format {
				t.Fatalf("verdict %s convention %q format %s, want %s %q %s\n%s", r.Verdict, r.Convention, r.Format, c.verdict, c.conv, format, describe(r))
			}
			if c.missing != nil && !slices.Equal(r.Missing, c.missing) {
				t.Errorf("missing %v, want %v", r.Missing, c.missing)
			}
			if c.problem != "" && !slices.ContainsFunc(r.Problems, func(p string) bool { return strings.Contains(p, c.problem) }) {
				t.Errorf("no problem contains %q:\n%s", c.problem, describe(r))
			}
			if c.message != "" && !strings.Contains(r.Message, c.message) {
				t.Errorf("message %q lacks %q", r.Message, c.message)
			}
			if c.warning != "" && !slices.ContainsFunc(r.Warnings, func(p string) bool { return strings.Contains(p, c.warning) }) {
				t.Errorf("no warning contains %q:\n%s", c.warning, describe(r))
			}
			if c.warning == "" && len(r.Warnings) > 0 {
				t.Errorf("unexpected warnings %v", r.Warnings)
			}
			if r.Verdict == OK && (r.Expected == 0 || r.Present != r.Expected || len(r.Missing) != 0 || len(r.Problems) != 0) {
				t.Errorf("ok with expected %d present %d missing %v problems %v", r.Expected, r.Present, r.Missing, r.Problems)
			}
			if !c.deep && r.BytesRead != 0 {
				t.Errorf("read %d tensor bytes without --deep", r.BytesRead)
			}
			if _, err := json.Marshal(r); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPromisedTwoLayersNamesLayerOne pins the partial report for a config
// promising more layers than the file has.
func TestPromisedTwoLayersNamesLayerOne(t *testing.T) {
	dir := rewrite(t, gen(t, testmodel.Qwen35Options{}), nil, setKey("mtp_num_hidden_layers", 2))
	r, err := MTP(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var layer1 []string
	for _, m := range r.Missing {
		if strings.HasPrefix(m, "mtp.layers.1.") {
			layer1 = append(layer1, m)
		}
	}
	if len(layer1) != 11 || len(r.Missing) != 11 {
		t.Fatalf("missing %v, want the 11 tensors of mtp.layers.1", r.Missing)
	}
	if r.Expected != 26 || r.Present != 15 {
		t.Errorf("expected %d present %d, want 26 and 15", r.Expected, r.Present)
	}
	if !strings.Contains(r.Message, fmt.Sprintf("only %d of %d", 15, 26)) {
		t.Errorf("message %q", r.Message)
	}
}
