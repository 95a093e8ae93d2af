package mlxpack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

// refModules lists the leaf modules of mlx-lm's model as a reference
// conversion's tensors show them (testdata/mlxconvert/NAME.header.json, the
// safetensors header of mlx_lm.convert's output): a U32 weight with scales
// is a quantized Linear or Embedding whose float shape had its last
// dimension ×32/bits; another 2-D weight is a Linear or Embedding; 1-D
// weights (norms) and conv1d's 3-D one belong to modules without
// to_quantized. Parameters not named weight (A_log, dt_bias) are no
// modules. Sorted by path.
func refModules(t *testing.T, name string, bits int) []QuantModule {
	t.Helper()
	tensors := refTensors(t, name)
	var mods []QuantModule
	for k, ti := range tensors {
		path, ok := strings.CutSuffix(k, ".weight")
		if !ok {
			continue
		}
		m := QuantModule{Path: path, Shape: slices.Clone(ti.Shape)}
		if _, q := tensors[path+".scales"]; q && ti.DType == "U32" {
			m.Quantizable = true
			m.Shape[len(m.Shape)-1] = m.Shape[len(m.Shape)-1] * 32 / int64(bits)
		} else {
			m.Quantizable = len(ti.Shape) == 2
		}
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b QuantModule) int { return strings.Compare(a.Path, b.Path) })
	return mods
}

type refTensor struct {
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// refTensors reads the tensors of testdata/mlxconvert/NAME.header.json.
func refTensors(t *testing.T, name string) map[string]refTensor {
	t.Helper()
	raw, err := os.ReadFile("testdata/mlxconvert/" + name + ".header.json")
	if err != nil {
		t.Fatal(err)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw, &hdr); err != nil {
		t.Fatal(err)
	}
	delete(hdr, "__metadata__")
	tensors := map[string]refTensor{}
	for k, v := range hdr {
		var ti refTensor
		if err := json.Unmarshal(v, &ti); err != nil {
			t.Fatal(err)
		}
		tensors[k] = ti
	}
	return tensors
}

// refQuantized is the set of modules with .scales in a reference conversion.
func refQuantized(t *testing.T, name string) map[string]bool {
	t.Helper()
	q := map[string]bool{}
	for k := range refTensors(t, name) {
		if p, ok := strings.CutSuffix(k, ".scales"); ok {
			q[p] = true
		}
	}
	return q
}

func mustPlan(t *testing.T, mods []QuantModule, opt QuantOptions) *QuantPlan {
	t.Helper()
	p, err := PlanQuant(mods, opt)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func blockJSON(t *testing.T, p *QuantPlan) string {
	t.Helper()
	b, err := json.Marshal(p.Block())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPlanQuantReference: for every quantized conversion of the reference
// set (mlx_lm.convert -q --q-group-size G --q-bits B, mlx-lm 0.32.0), the
// plan quantizes exactly the modules that have .scales there, and its
// block is the config's quantization and quantization_config blocks, key
// order included.
func TestPlanQuantReference(t *testing.T) {
	for _, c := range []struct {
		name, modelType string
		group, bits     int
	}{
		{"qwen3_g64_b4", "qwen3", 64, 4},
		{"qwen3_g64_b8", "qwen3", 64, 8},
		{"qwen3_g32_b4", "qwen3", 32, 4},
		{"qwen35_g64_b4", "qwen3_5", 64, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			mods := refModules(t, c.name, c.bits)
			p := mustPlan(t, mods, QuantOptions{ModelType: c.modelType, Bits: c.bits, GroupSize: c.group, NumLayers: 4})
			want := refQuantized(t, c.name)
			n := 0
			for _, d := range p.Modules {
				if d.Quantized != want[d.Path] {
					t.Errorf("%s: quantized %v, mlx-lm %v (%s)", d.Path, d.Quantized, want[d.Path], d.Why)
				}
				if d.Quantized {
					n++
					if d.QuantSpec != p.Global || d.Entry {
						t.Errorf("%s: %+v entry %v, want the global %+v", d.Path, d.QuantSpec, d.Entry, p.Global)
					}
				}
			}
			if n != len(want) || n == 0 {
				t.Errorf("%d modules quantized, mlx-lm %d", n, len(want))
			}
			raw, err := os.ReadFile("testdata/mlxconvert/" + c.name + ".config.json")
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]json.RawMessage
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			got := blockJSON(t, p)
			for _, key := range []string{"quantization", "quantization_config"} {
				var w bytes.Buffer
				if err := json.Compact(&w, cfg[key]); err != nil {
					t.Fatal(err)
				}
				if got != w.String() {
					t.Errorf("%s:\n got %s\nwant %s", key, got, w.String())
				}
			}
		})
	}
}

// highLayers lists, for n layers, the layers whose v_proj and down_proj get
// a recipe's high bits, written out from mlx-lm's rule (i < n/8, i ≥ 7n/8,
// or (i − n/8) mod 3 = 2).
var highLayers = map[int][]int{
	2:  {1},
	4:  {2, 3},
	28: {0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27},
	48: {0, 1, 2, 3, 4, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47},
}

// denseModules is a Llama/Qwen3-shaped module list of n layers (prefix
// before "model."), with lm_head unless tied.
func denseModules(prefix string, n int, lmHead bool) []QuantModule {
	mods := []QuantModule{{Path: prefix + "model.embed_tokens", Quantizable: true, Shape: []int64{512, 256}}}
	for l := range n {
		for _, s := range []struct {
			name  string
			shape []int64
		}{
			{"self_attn.q_proj", []int64{256, 256}}, {"self_attn.k_proj", []int64{128, 256}},
			{"self_attn.v_proj", []int64{128, 256}}, {"self_attn.o_proj", []int64{256, 256}},
			{"mlp.gate_proj", []int64{512, 256}}, {"mlp.up_proj", []int64{512, 256}},
			{"mlp.down_proj", []int64{256, 512}}, {"input_layernorm", []int64{256}},
		} {
			mods = append(mods, QuantModule{Path: fmt.Sprintf("%smodel.layers.%d.%s", prefix, l, s.name),
				Quantizable: len(s.shape) == 2, Shape: s.shape})
		}
	}
	mods = append(mods, QuantModule{Path: prefix + "model.norm", Shape: []int64{256}})
	if lmHead {
		mods = append(mods, QuantModule{Path: prefix + "lm_head", Quantizable: true, Shape: []int64{512, 256}})
	}
	return mods
}

// TestPlanQuantRecipes: mlx-lm's mixed recipes give v_proj and down_proj of
// the high layers, and lm_head, the high bits, everything else quantizable
// the low bits, each with a {"group_size", "bits", "mode"} entry — on the
// reference Qwen3 (2 layers, tied lm_head) and Qwen3.5 (4 layers, v_proj
// only in its one full-attention layer) module trees and on 28- and
// 48-layer trees.
func TestPlanQuantRecipes(t *testing.T) {
	type tree struct {
		name, modelType string
		mods            []QuantModule
		layers          int
		layerAt         int // the position of the layer index in a path
	}
	trees := []tree{
		{"qwen3 reference", "qwen3", refModules(t, "qwen3_bf16", 16), 2, 2},
		{"qwen3.5 reference", "qwen3_5", refModules(t, "qwen35_g64_b4", 4), 4, 3},
		{"28 layers", "qwen3", denseModules("", 28, true), 28, 2},
		{"48 layers, language_model.", "qwen3_5", denseModules("language_model.", 48, true), 48, 3},
	}
	for _, tr := range trees {
		for recipe, lohi := range QuantRecipes {
			for _, group := range []int{32, 64, 128} {
				t.Run(fmt.Sprintf("%s/%s/g%d", tr.name, recipe, group), func(t *testing.T) {
					p := mustPlan(t, tr.mods, QuantOptions{ModelType: tr.modelType, GroupSize: group, Recipe: recipe, NumLayers: tr.layers})
					if p.Global != (QuantSpec{Bits: 4, GroupSize: group, Mode: "affine"}) {
						t.Errorf("global %+v", p.Global)
					}
					high := highLayers[tr.layers]
					var entries []string
					for _, d := range p.Modules {
						m, _ := findModule(tr.mods, d.Path)
						if !m.Quantizable || m.Shape[len(m.Shape)-1]%int64(group) != 0 {
							if d.Quantized {
								t.Errorf("%s quantized", d.Path)
							}
							continue
						}
						want := lohi[0]
						parts := strings.Split(d.Path, ".")
						isHighLayer := len(parts) > tr.layerAt && slices.Contains(high, atoi(t, parts[tr.layerAt]))
						if strings.HasSuffix(d.Path, "lm_head") ||
							isHighLayer && (strings.HasSuffix(d.Path, "v_proj") || strings.HasSuffix(d.Path, "down_proj")) {
							want = lohi[1]
						}
						if !d.Quantized || d.Bits != want || d.GroupSize != group || !d.Entry || !d.EntryMode {
							t.Errorf("%s: %+v, want %d bits, group %d, with an entry", d.Path, d, want, group)
						}
						entries = append(entries, fmt.Sprintf(`%q:{"group_size":%d,"bits":%d,"mode":"affine"}`, d.Path, group, want))
					}
					want := fmt.Sprintf(`{"group_size":%d,"bits":4,"mode":"affine",%s}`, group, strings.Join(entries, ","))
					if got := blockJSON(t, p); got != want {
						t.Errorf("block\n got %s\nwant %s", got, want)
					}
				})
			}
		}
	}
	// The reference Qwen3.5 tree spelt out: layers 2 and 3 use more bits;
	// layers 0-2 are linear attention (no v_proj); lm_head is high.
	p := mustPlan(t, refModules(t, "qwen35_g64_b4", 4), QuantOptions{ModelType: "qwen3_5", Recipe: "mixed_3_6", NumLayers: 4})
	var six []string
	for _, d := range p.Modules {
		if d.Bits == 6 {
			six = append(six, d.Path)
		}
	}
	if want := []string{
		"language_model.lm_head",
		"language_model.model.layers.2.mlp.down_proj",
		"language_model.model.layers.3.mlp.down_proj",
		"language_model.model.layers.3.self_attn.v_proj",
	}; !slices.Equal(six, want) {
		t.Errorf("6-bit modules %q, want %q", six, want)
	}
}

func findModule(mods []QuantModule, path string) (QuantModule, bool) {
	for _, m := range mods {
		if m.Path == path {
			return m, true
		}
	}
	return QuantModule{}, false
}

func atoi(t *testing.T, s string) int {
	var v int
	if _, err := fmt.Sscan(s, &v); err != nil {
		return -1
	}
	return v
}

// moeModules is a one-layer MoE module tree: attention, a router gate
// [experts, 256], stacked experts, and with shared a shared expert and its
// gate [1, 256].
func moeModules(prefix string, hidden int64, shared bool) []QuantModule {
	l := prefix + "model.layers.0."
	mods := []QuantModule{
		{Path: prefix + "model.embed_tokens", Quantizable: true, Shape: []int64{512, hidden}},
		{Path: l + "self_attn.q_proj", Quantizable: true, Shape: []int64{256, hidden}},
		{Path: l + "self_attn.v_proj", Quantizable: true, Shape: []int64{128, hidden}},
		{Path: l + "mlp.gate", Quantizable: true, Shape: []int64{8, hidden}},
		{Path: l + "mlp.switch_mlp.gate_proj", Quantizable: true, Shape: []int64{8, 128, hidden}},
		{Path: l + "mlp.switch_mlp.down_proj", Quantizable: true, Shape: []int64{8, hidden, 128}},
	}
	if shared {
		mods = append(mods,
			QuantModule{Path: l + "mlp.shared_expert.down_proj", Quantizable: true, Shape: []int64{hidden, 128}},
			QuantModule{Path: l + "mlp.shared_expert_gate", Quantizable: true, Shape: []int64{1, hidden}})
	}
	return append(mods, QuantModule{Path: prefix + "lm_head", Quantizable: true, Shape: []int64{512, hidden}})
}

// TestPlanQuantRouterGates: the families whose quant_predicate keeps router
// gates at 8 bits, group 64, get a {"group_size": 64, "bits": 8} entry per
// gate (no mode key, as mlx-lm writes it), whatever the global settings;
// qwen3_5 only with experts; a recipe replaces the predicate.
func TestPlanQuantRouterGates(t *testing.T) {
	gate := `{"group_size":64,"bits":8}`
	for _, c := range []struct {
		name string
		mods []QuantModule
		opt  QuantOptions
		want string
	}{
		{"qwen3_moe", moeModules("", 256, false), QuantOptions{ModelType: "qwen3_moe"},
			`{"group_size":64,"bits":4,"mode":"affine","model.layers.0.mlp.gate":` + gate + `}`},
		{"qwen3_moe g32 b2", moeModules("", 256, false), QuantOptions{ModelType: "qwen3_moe", Bits: 2, GroupSize: 32},
			`{"group_size":32,"bits":2,"mode":"affine","model.layers.0.mlp.gate":` + gate + `}`},
		{"qwen3_next", moeModules("", 256, true), QuantOptions{ModelType: "qwen3_next", Bits: 3, GroupSize: 128},
			`{"group_size":128,"bits":3,"mode":"affine","model.layers.0.mlp.gate":` + gate + `,"model.layers.0.mlp.shared_expert_gate":` + gate + `}`},
		{"qwen3_5 with experts", moeModules("language_model.", 256, true), QuantOptions{ModelType: "qwen3_5", NumExperts: 8},
			`{"group_size":64,"bits":4,"mode":"affine","language_model.model.layers.0.mlp.gate":` + gate + `,"language_model.model.layers.0.mlp.shared_expert_gate":` + gate + `}`},
		{"qwen3_5_moe", moeModules("language_model.", 256, true), QuantOptions{ModelType: "qwen3_5_moe", Bits: 8},
			`{"group_size":64,"bits":8,"mode":"affine","language_model.model.layers.0.mlp.gate":` + gate + `,"language_model.model.layers.0.mlp.shared_expert_gate":` + gate + `}`},
		{"qwen3_5 without experts", moeModules("language_model.", 256, true), QuantOptions{ModelType: "qwen3_5"},
			`{"group_size":64,"bits":4,"mode":"affine"}`},
		{"llama", moeModules("", 256, true), QuantOptions{ModelType: "llama"},
			`{"group_size":64,"bits":4,"mode":"affine"}`},
		{"qwen3_moe recipe", moeModules("", 256, false), QuantOptions{ModelType: "qwen3_moe", Recipe: "mixed_2_6", NumLayers: 1},
			`{"group_size":64,"bits":4,"mode":"affine",` +
				`"model.embed_tokens":{"group_size":64,"bits":2,"mode":"affine"},` +
				`"model.layers.0.self_attn.q_proj":{"group_size":64,"bits":2,"mode":"affine"},` +
				`"model.layers.0.self_attn.v_proj":{"group_size":64,"bits":6,"mode":"affine"},` +
				`"model.layers.0.mlp.gate":{"group_size":64,"bits":2,"mode":"affine"},` +
				`"model.layers.0.mlp.switch_mlp.gate_proj":{"group_size":64,"bits":2,"mode":"affine"},` +
				`"model.layers.0.mlp.switch_mlp.down_proj":{"group_size":64,"bits":6,"mode":"affine"},` +
				`"lm_head":{"group_size":64,"bits":6,"mode":"affine"}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := mustPlan(t, c.mods, c.opt)
			if got := blockJSON(t, p); got != c.want {
				t.Errorf("block\n got %s\nwant %s", got, c.want)
			}
			for _, d := range p.Modules {
				if !d.Quantized {
					t.Errorf("%s not quantized: %s", d.Path, d.Why)
				}
			}
		})
	}
}

// TestPlanQuantShapes: a module whose last dimension is not a multiple of
// the global group size stays float with no entry (mlx-lm's
// wrapped_predicate), whatever its family or recipe; one whose predicate
// asks for group 64 under a global 32 that 64 does not divide is refused
// (mx.quantize refuses it in mlx-lm).
func TestPlanQuantShapes(t *testing.T) {
	mods := []QuantModule{
		{Path: "model.layers.0.mlp.down_proj", Quantizable: true, Shape: []int64{256, 96}},
		{Path: "model.layers.0.mlp.up_proj", Quantizable: true, Shape: []int64{96, 256}},
		{Path: "model.layers.0.mlp.switch_mlp.up_proj", Quantizable: true, Shape: []int64{8, 256, 160}},
		{Path: "model.layers.0.linear_attn.conv1d", Shape: []int64{512, 4, 1}},
		{Path: "model.norm", Shape: []int64{256}},
	}
	for _, c := range []struct {
		group  int
		recipe string
		want   []bool
	}{
		{64, "", []bool{false, true, false, false, false}},
		{32, "", []bool{true, true, true, false, false}},
		{128, "", []bool{false, true, false, false, false}},
		{64, "mixed_3_4", []bool{false, true, false, false, false}},
		{32, "mixed_4_6", []bool{true, true, true, false, false}},
	} {
		p := mustPlan(t, mods, QuantOptions{ModelType: "qwen3_moe", GroupSize: c.group, Recipe: c.recipe, NumLayers: 1})
		for i, d := range p.Modules {
			if d.Quantized != c.want[i] || (!d.Quantized && d.Entry) {
				t.Errorf("g%d %s: %s quantized %v entry %v, want %v (%s)", c.group, c.recipe, d.Path, d.Quantized, d.Entry, c.want[i], d.Why)
			}
		}
	}
	_, err := PlanQuant(moeModules("", 96, false), QuantOptions{ModelType: "qwen3_moe", GroupSize: 32})
	if !errors.Is(err, ErrNotDivisible) || !strings.Contains(err.Error(), "model.layers.0.mlp.gate") {
		t.Errorf("router gate [8, 96] at group 64: %v", err)
	}
}

func TestParseModuleBits(t *testing.T) {
	for _, c := range []struct {
		in      string
		pattern string
		bits    int
		err     string
	}{
		{in: `down_proj=6`, pattern: "down_proj", bits: 6},
		{in: `^lm_head$=8`, pattern: "^lm_head$", bits: 8},
		{in: `layers\.(0|1)\..*=3`, pattern: `layers\.(0|1)\..*`, bits: 3},
		{in: `a=b=2`, pattern: "a=b", bits: 2},
		{in: `down_proj`, err: "want REGEX=BITS"},
		{in: `=4`, err: "want REGEX=BITS"},
		{in: `(=4`, err: "missing closing )"},
		{in: `x=7`, err: "bit width"},
		{in: `x=16`, err: "bit width"},
		{in: `x=four`, err: "not a number"},
	} {
		o, err := ParseModuleBits(c.in)
		if c.err != "" {
			if !errors.Is(err, ErrModuleBits) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || o.Pattern.String() != c.pattern || o.Bits != c.bits {
			t.Errorf("%q: %v %v, want %s=%d", c.in, o, err, c.pattern, c.bits)
		}
	}
}

func overrides(t *testing.T, s ...string) []ModuleBits {
	var out []ModuleBits
	for _, x := range s {
		o, err := ParseModuleBits(x)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

// TestPlanQuantModuleBits: --module-bits applies after the family and the
// recipe, the first matching override winning; it writes an entry with
// "mode" only where the module's parameters then differ from the global
// ones or it had an entry already.
func TestPlanQuantModuleBits(t *testing.T) {
	mods := moeModules("", 256, false)
	p := mustPlan(t, mods, QuantOptions{ModelType: "qwen3_moe",
		ModuleBits: overrides(t, `switch_mlp\.down_proj$=8`, `v_proj=4`, `mlp\.gate$=6`, `proj=2`)})
	want := `{"group_size":64,"bits":4,"mode":"affine",` +
		`"model.layers.0.self_attn.q_proj":{"group_size":64,"bits":2,"mode":"affine"},` +
		`"model.layers.0.mlp.gate":{"group_size":64,"bits":6,"mode":"affine"},` +
		`"model.layers.0.mlp.switch_mlp.gate_proj":{"group_size":64,"bits":2,"mode":"affine"},` +
		`"model.layers.0.mlp.switch_mlp.down_proj":{"group_size":64,"bits":8,"mode":"affine"}}`
	if got := blockJSON(t, p); got != want {
		t.Errorf("block\n got %s\nwant %s", got, want)
	}
	bits := map[string]int{}
	for _, d := range p.Modules {
		bits[d.Path] = d.Bits
	}
	// q_proj matches "proj=2" (v_proj=4 is the global value: no entry).
	if bits["model.layers.0.self_attn.q_proj"] != 2 || bits["model.layers.0.self_attn.v_proj"] != 4 || bits["lm_head"] != 4 {
		t.Errorf("bits %v", bits)
	}
	if d, _ := p.Lookup("model.layers.0.self_attn.q_proj"); !d.Entry {
		t.Errorf("q_proj overridden to 2 bits without an entry: %+v", d)
	}

	// On a recipe.
	p = mustPlan(t, denseModules("", 2, true), QuantOptions{ModelType: "qwen3", Recipe: "mixed_3_6", NumLayers: 2,
		ModuleBits: overrides(t, `^model\.embed_tokens$=8`)})
	if d, _ := p.Lookup("model.embed_tokens"); d.Bits != 8 || !d.EntryMode {
		t.Errorf("embed_tokens %+v", d)
	}
	if d, _ := p.Lookup("model.layers.1.mlp.down_proj"); d.Bits != 6 {
		t.Errorf("down_proj of layer 1 %+v", d)
	}

	for _, c := range []struct {
		name string
		mods []QuantModule
		o    []ModuleBits
		want error
		text string
	}{
		{"matches nothing", mods, overrides(t, `o_proj=8`), ErrModuleBits, "matches no quantizable module"},
		{"matches only a norm", denseModules("", 1, false), overrides(t, `layernorm=8`), ErrModuleBits, "matches no quantizable module"},
		{"forces a float module", []QuantModule{{Path: "a.up_proj", Quantizable: true, Shape: []int64{64, 96}}}, overrides(t, `up=8`), ErrNotDivisible, "a.up_proj has shape [64 96], group size 64"},
	} {
		_, err := PlanQuant(c.mods, QuantOptions{ModelType: "qwen3_moe", ModuleBits: c.o})
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: %v, want %v %q", c.name, err, c.want, c.text)
		}
	}
}

func TestPlanQuantErrors(t *testing.T) {
	mods := denseModules("", 2, true)
	for _, c := range []struct {
		name string
		mods []QuantModule
		opt  QuantOptions
		want error
		text string
	}{
		{"family", mods, QuantOptions{ModelType: "gpt_oss"}, ErrQuantFamily, "llama, qwen2, qwen3, qwen3_5, qwen3_5_moe, qwen3_moe, qwen3_next"},
		{"bits", mods, QuantOptions{ModelType: "qwen3", Bits: 7}, ErrBits, "7"},
		{"group", mods, QuantOptions{ModelType: "qwen3", GroupSize: 16}, ErrGroupSize, "16"},
		{"recipe", mods, QuantOptions{ModelType: "qwen3", Recipe: "mixed_5_8"}, ErrRecipe, `"mixed_5_8" is unknown`},
		{"recipe without layers", mods, QuantOptions{ModelType: "qwen3", Recipe: "mixed_3_6"}, ErrRecipe, "number of layers"},
		{"recipe without down_proj", []QuantModule{{Path: "model.layers.0.mlp.fc1", Quantizable: true, Shape: []int64{64, 64}}},
			QuantOptions{ModelType: "qwen3", Recipe: "mixed_3_6", NumLayers: 1}, ErrRecipe, "no down_proj"},
		{"recipe without a layer index", append(slices.Clone(mods), QuantModule{Path: "model.extra.proj", Quantizable: true, Shape: []int64{64, 64}}),
			QuantOptions{ModelType: "qwen3", Recipe: "mixed_3_6", NumLayers: 2}, ErrRecipe, "model.extra.proj has no layer index"},
	} {
		_, err := PlanQuant(c.mods, c.opt)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: %v, want %v %q", c.name, err, c.want, c.text)
		}
	}
}
