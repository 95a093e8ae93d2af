package mlxpack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	desc "github.com/ferry-llm/ferry/internal/family"
)

// Which modules `mlx_lm.convert -q` quantizes, and how (ml-explore/mlx-lm
// d78bf58e, 0.32.0: mlx_lm/utils.py quantize_model, mlx_lm/convert.py
// mixed_quant_predicate_builder, the models' quant_predicate; mlx
// python/mlx/nn/layers/quantized.py quantize; ../shared/notes/mlx.md §1,
// §4). PlanQuant makes every decision from module paths and weight shapes
// alone, reading no weight data.

// QuantModule is one leaf module of mlx-lm's model, after sanitize.
type QuantModule struct {
	// Path is the module's dotted path in mlx-lm's parameter tree, without
	// the parameter name: "model.layers.0.mlp.down_proj",
	// "language_model.model.layers.3.mlp.switch_mlp.up_proj".
	Path string
	// Quantizable: the module has to_quantized (nn.Linear, nn.Embedding,
	// SwitchLinear). Norms, Conv1d and bare parameters (A_log, dt_bias)
	// are not, and are never quantized.
	Quantizable bool
	// Shape is the float weight's shape ([out, in], [vocab, dim],
	// [experts, out, in]); its last dimension is what is grouped.
	Shape []int64
}

// QuantSpec is the quantization of one module.
type QuantSpec struct {
	Bits      int
	GroupSize int
	Mode      string // "affine"
}

// QuantDecision is PlanQuant's answer for one module.
type QuantDecision struct {
	Path      string
	Quantized bool // false: the module stays float and has no config entry
	QuantSpec      // the parameters to quantize with, when Quantized
	// Entry: the module has a per-module entry in the config's quantization
	// block (its parameters come from a predicate, a recipe or an
	// override, not from the global keys). EntryMode: that entry has a
	// "mode" key (recipes and --module-bits do; mlx-lm's router-gate
	// predicates write {"group_size", "bits"} only).
	Entry, EntryMode bool
	// Why says in words what decided (for plans and --json).
	Why string
}

// QuantOptions are the arguments of PlanQuant.
type QuantOptions struct {
	// ModelType is the mlx-lm model type (config.json model_type, as
	// mlx-lm reads it): llama, qwen2, qwen3, qwen3_moe, qwen3_5,
	// qwen3_5_moe, qwen3_next.
	ModelType string
	// Bits and GroupSize are the global parameters (--bits,
	// --group-size); 0 means mlx-lm's defaults, 4 and 64.
	Bits, GroupSize int
	// Recipe is "" or one of QuantRecipes. Like `mlx_lm.convert
	// --quant-predicate`, it replaces the model's own predicate (router
	// gates then get the recipe's bits too), and every quantized module
	// gets a per-module entry. ferry always states the group size:
	// `mlx_lm.convert --quant-predicate R` without --q-group-size writes
	// "group_size": null in those entries, which mlx-lm reads as 64.
	Recipe string
	// NumLayers is len(model.layers) (num_hidden_layers, in text_config
	// for qwen3_5); the recipes need it.
	NumLayers int
	// NumExperts is num_experts (text_config's for qwen3_5): qwen3_5 keeps
	// router gates at 8 bits only when it is > 0.
	NumExperts int
	// ModuleBits are --module-bits overrides, applied last; the first
	// that matches a module wins.
	ModuleBits []ModuleBits
}

// ModuleBits is one --module-bits REGEX=BITS override: quantizable
// modules whose path the expression matches (anywhere, as Go's
// regexp.MatchString; anchor with ^…$) get Bits at the global group size.
type ModuleBits struct {
	Pattern *regexp.Regexp
	Bits    int
}

// ParseModuleBits parses "REGEX=BITS" (the last '=' separates them).
func ParseModuleBits(s string) (ModuleBits, error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 {
		return ModuleBits{}, fmt.Errorf("%w %q: want REGEX=BITS", ErrModuleBits, s)
	}
	re, err := regexp.Compile(s[:i])
	if err != nil {
		return ModuleBits{}, fmt.Errorf("%w %q: %v", ErrModuleBits, s, err)
	}
	bits, err := strconv.Atoi(s[i+1:])
	if err != nil {
		return ModuleBits{}, fmt.Errorf("%w %q: bits %q is not a number", ErrModuleBits, s, s[i+1:])
	}
	if err := CheckAffine(bits, 64); err != nil {
		return ModuleBits{}, fmt.Errorf("%w %q: %w", ErrModuleBits, s, err)
	}
	return ModuleBits{Pattern: re, Bits: bits}, nil
}

// QuantRecipes are mlx-lm's mixed recipes: name → low and high bits.
var QuantRecipes = map[string][2]int{
	"mixed_2_6": {2, 6},
	"mixed_3_4": {3, 4},
	"mixed_3_6": {3, 6},
	"mixed_4_6": {4, 6},
}

// QuantPlan is the quantization of a whole model.
type QuantPlan struct {
	Global  QuantSpec
	Modules []QuantDecision // in the order of PlanQuant's modules
}

// PlanQuant decides, module by module, what `mlx_lm.convert -q
// [--q-bits B] [--q-group-size G] [--quant-predicate R]` does, then
// applies opt.ModuleBits:
//
//   - a module without to_quantized stays float;
//   - so does one whose weight's last dimension is not a multiple of the
//     global group size (no entry: the loader sees no .scales);
//   - with a recipe, the recipe's bits (mixedBits); else the model's
//     predicate (router gates: 8 bits, group 64); else the global bits.
//
// An override that matches no quantizable module, or forces one whose last
// dimension is not a multiple of the group size, is an error; so is a
// recipe on a model without down_proj modules (as in mlx-lm).
//
// The recipes find the layer index at the position it has in the path of
// a down_proj module; mlx-lm takes the first of named_modules(), which
// lists modules last-first, so PlanQuant takes the last one of modules.
func PlanQuant(modules []QuantModule, opt QuantOptions) (*QuantPlan, error) {
	// The router gates the model's quant_predicate keeps at 8 bits, group
	// 64 (mlx_lm/models/<type>.py): its family descriptor's.
	f, ok := desc.ByMLXModelType(opt.ModelType)
	if !ok || f.MLX.ModelType != opt.ModelType || f.MLX.Sanitize == "" {
		return nil, fmt.Errorf("%w: %q (supported: %s)", ErrQuantFamily, opt.ModelType, strings.Join(quantModelTypes(), ", "))
	}
	gates := f.MLX.RouterGates
	if f.MLX.RouterGatesNeedExperts && opt.NumExperts <= 0 {
		gates = nil
	}
	g := QuantSpec{Bits: opt.Bits, GroupSize: opt.GroupSize, Mode: "affine"}
	if g.Bits == 0 {
		g.Bits = 4
	}
	if g.GroupSize == 0 {
		g.GroupSize = 64
	}
	if err := CheckAffine(g.Bits, g.GroupSize); err != nil {
		return nil, err
	}
	var mixed func(path string) (QuantSpec, string, error)
	if opt.Recipe != "" {
		var err error
		if mixed, err = mixedBits(modules, opt, g.GroupSize); err != nil {
			return nil, err
		}
	}
	used := make([]bool, len(opt.ModuleBits))
	p := &QuantPlan{Global: g, Modules: make([]QuantDecision, len(modules))}
	for i, m := range modules {
		d := QuantDecision{Path: m.Path}
		switch {
		case !m.Quantizable:
			d.Why = "not quantizable (no to_quantized)"
		case len(m.Shape) == 0 || m.Shape[len(m.Shape)-1]%int64(g.GroupSize) != 0:
			d.Why = fmt.Sprintf("stays float: last dimension of %v is not a multiple of the group size %d", m.Shape, g.GroupSize)
		case mixed != nil:
			spec, why, err := mixed(m.Path)
			if err != nil {
				return nil, err
			}
			d = QuantDecision{Path: m.Path, Quantized: true, QuantSpec: spec, Entry: true, EntryMode: true, Why: why}
		case desc.HasSuffix(m.Path, gates):
			d = QuantDecision{Path: m.Path, Quantized: true, QuantSpec: QuantSpec{Bits: 8, GroupSize: 64, Mode: "affine"},
				Entry: true, Why: opt.ModelType + " router gate: 8 bits, group 64"}
		default:
			d = QuantDecision{Path: m.Path, Quantized: true, QuantSpec: g, Why: "global"}
		}
		if m.Quantizable {
			for j, o := range opt.ModuleBits {
				if !o.Pattern.MatchString(m.Path) {
					continue
				}
				used[j] = true
				if len(m.Shape) == 0 || m.Shape[len(m.Shape)-1]%int64(g.GroupSize) != 0 {
					return nil, fmt.Errorf("%w: --module-bits %s=%d: module %s has shape %v, group size %d",
						ErrNotDivisible, o.Pattern, o.Bits, m.Path, m.Shape, g.GroupSize)
				}
				spec := QuantSpec{Bits: o.Bits, GroupSize: g.GroupSize, Mode: "affine"}
				entry := d.Entry || spec != g
				d = QuantDecision{Path: m.Path, Quantized: true, QuantSpec: spec, Entry: entry, EntryMode: entry,
					Why: fmt.Sprintf("--module-bits %s=%d", o.Pattern, o.Bits)}
				break
			}
		}
		if d.Quantized && m.Shape[len(m.Shape)-1]%int64(d.GroupSize) != 0 {
			// A router gate at group 64 under a global group of 32: mlx-lm
			// passes the shape check and then mx.quantize refuses it.
			return nil, fmt.Errorf("%w: module %s has shape %v, quantized at group size %d (%s)",
				ErrNotDivisible, m.Path, m.Shape, d.GroupSize, d.Why)
		}
		p.Modules[i] = d
	}
	for j, u := range used {
		if !u {
			return nil, fmt.Errorf("%w: %s=%d matches no quantizable module", ErrModuleBits, opt.ModuleBits[j].Pattern, opt.ModuleBits[j].Bits)
		}
	}
	return p, nil
}

// mixedBits is mlx-lm's mixed_quant_predicate for opt.Recipe: lm_head, and
// v_proj (v_a_proj, v_b_proj) and down_proj modules of layers that "use
// more bits", get the high bits; everything else the low bits. A layer uses
// more bits when its index i, of n layers, has i < n/8, i ≥ 7n/8 or
// (i − n/8) mod 3 = 2 (integer division), as llama.cpp's Q4_K_M chooses.
// Paths are tested by substring, as mlx-lm does.
func mixedBits(modules []QuantModule, opt QuantOptions, group int) (func(string) (QuantSpec, string, error), error) {
	bits, ok := QuantRecipes[opt.Recipe]
	if !ok {
		return nil, fmt.Errorf("%w %q is unknown (mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6)", ErrRecipe, opt.Recipe)
	}
	if opt.NumLayers <= 0 {
		return nil, fmt.Errorf("%w %s: the number of layers is needed (num_hidden_layers)", ErrRecipe, opt.Recipe)
	}
	down := ""
	for _, m := range modules {
		if strings.Contains(m.Path, "down_proj") {
			down = m.Path
		}
	}
	if down == "" {
		return nil, fmt.Errorf("%w %s: the model has no down_proj module (mlx-lm: \"Model does not have expected keys for mixed quant\")", ErrRecipe, opt.Recipe)
	}
	parts := strings.Split(down, ".")
	loc := len(parts) - 1 // mlx-lm's loop leaves the last position when no part is a number
	for i, s := range parts {
		if isDigits(s) {
			loc = i
			break
		}
	}
	n := opt.NumLayers
	return func(path string) (QuantSpec, string, error) {
		index := 0
		if parts := strings.Split(path, "."); len(parts) > loc {
			v, err := strconv.Atoi(parts[loc])
			if err != nil || !isDigits(parts[loc]) {
				return QuantSpec{}, "", fmt.Errorf("%w %s: module %s has no layer index at position %d (mlx-lm fails here too)", ErrRecipe, opt.Recipe, path, loc)
			}
			index = v
		}
		more := index < n/8 || index >= 7*n/8 || (index-n/8)%3 == 2
		b, why := bits[0], "low"
		switch {
		case more && (strings.Contains(path, "v_proj") || strings.Contains(path, "v_a_proj") || strings.Contains(path, "v_b_proj")):
			b, why = bits[1], fmt.Sprintf("high: value projection of layer %d", index)
		case more && strings.Contains(path, "down_proj"):
			b, why = bits[1], fmt.Sprintf("high: down_proj of layer %d", index)
		case strings.Contains(path, "lm_head"):
			b, why = bits[1], "high: lm_head"
		}
		return QuantSpec{Bits: b, GroupSize: group, Mode: "affine"}, opt.Recipe + " " + why, nil
	}, nil
}

func isDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// quantModelTypes are the mlx-lm model types PlanQuant takes (aliases
// and remapped types resolved first).
func quantModelTypes() []string {
	var out []string
	for _, f := range desc.All() {
		if f.MLX != nil && f.MLX.Sanitize != "" {
			out = append(out, f.MLX.ModelType)
		}
	}
	slices.Sort(out)
	return out
}

// Lookup returns the decision for the module at path.
func (p *QuantPlan) Lookup(path string) (QuantDecision, bool) {
	for _, d := range p.Modules {
		if d.Path == path {
			return d, true
		}
	}
	return QuantDecision{}, false
}

// Block is the config.json "quantization" block (and its
// "quantization_config" copy) as mlx-lm writes it: "group_size", "bits",
// "mode", then one entry per module with Entry set, in module order, each
// {"group_size", "bits"[, "mode"]}. Its MarshalJSON keeps that key order
// (mlx-lm's save_config sorts only the top-level keys).
func (p *QuantPlan) Block() QuantBlock { return QuantBlock{p} }

// QuantBlock is a QuantPlan's config block; see QuantPlan.Block.
type QuantBlock struct{ p *QuantPlan }

// MarshalJSON writes the block with mlx-lm's key order.
func (b QuantBlock) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	g := b.p.Global
	fmt.Fprintf(&buf, `{"group_size":%d,"bits":%d,"mode":%q`, g.GroupSize, g.Bits, g.Mode)
	for _, d := range b.p.Modules {
		if !d.Entry {
			continue
		}
		key, err := json.Marshal(d.Path)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&buf, `,%s:{"group_size":%d,"bits":%d`, key, d.GroupSize, d.Bits)
		if d.EntryMode {
			fmt.Fprintf(&buf, `,"mode":%q`, d.Mode)
		}
		buf.WriteByte('}')
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}
