package mlxpack

import (
	"regexp"
	"slices"
	"strings"

	desc "github.com/ferry-llm/ferry/internal/family"
)

// family is what repack knows of one mlx-lm model type: what its
// sanitize() does to a checkpoint's names (mlx-lm d78bf58e,
// mlx_lm/models/<type>.py), read from the type's descriptor in
// internal/family.
type family struct {
	// renamesPacked: sanitize maps compressed-tensors
	// weight_packed/weight_scale/weight_shape to weight/scales/biases
	// (deepseek_v3.py, under "Remap for int4"), so a symlink farm of a
	// 4-bit checkpoint loads as it is.
	renamesPacked bool
	// stacksExperts: sanitize stacks per-expert .weight tensors (only
	// those) into switch_mlp (qwen3_moe.py, qwen3_5_moe.py
	// _normalize_experts), so --rewrite writes packed experts already
	// stacked, under the switch_mlp names, for weight, scales and biases
	// to load together.
	stacksExperts bool
	// paths maps a checkpoint module to its module path(s) in mlx-lm's
	// model after sanitize, where per-layer quantization overrides are
	// keyed.
	paths func(module string) []string
}

// familyOf is the family of a model type, from its descriptor
// (internal/family: MLX.RenamesPacked, StacksExperts and the path mapping
// its Paths names); the zero family (nothing renamed, no known paths) for
// a type ferry does not know.
func familyOf(modelType string) family {
	f, ok := desc.ByMLXModelType(modelType)
	if !ok {
		return family{}
	}
	return family{renamesPacked: f.MLX.RenamesPacked, stacksExperts: f.MLX.StacksExperts, paths: pathKinds[f.MLX.Paths]}
}

// pathKinds resolves a descriptor's MLX.Paths: how mlx-lm's sanitize moves
// module paths. A family whose sanitize moves them a new way adds its
// function here.
var pathKinds = map[string]func(module string) []string{
	// sanitize keeps module paths as they are (it only drops a tied
	// lm_head or rotary buffers).
	"same":        samePath,
	"switch_mlp":  switchMLPPath,
	"deepseek_v3": deepseekV3Path,
	"qwen3_5_moe": qwen35MoEPath,
}

// familyTypes lists, sorted and comma-separated, the model types whose
// family has a known path mapping and satisfies keep (for messages).
func familyTypes(keep func(family) bool) string {
	var t []string
	for _, mt := range desc.MLXModelTypes(func(m *desc.MLX) bool { return m.Paths != "" }) {
		if f, _ := desc.ByMLXModelType(mt); slices.Contains(f.MLX.Aliases, mt) {
			continue // named by the type it is an alias of
		}
		if keep(familyOf(mt)) {
			t = append(t, mt)
		}
	}
	return strings.Join(t, ", ")
}

// mlxPaths maps a checkpoint module to the module path(s) mlx-lm's model
// has after sanitize. ok is false if ferry does not know the mapping for
// this model type (the module is returned as it is).
func mlxPaths(modelType, module string) (paths []string, ok bool) {
	f := familyOf(modelType)
	if f.paths == nil {
		return []string{module}, false
	}
	return f.paths(module), true
}

var (
	expertRE      = regexp.MustCompile(`\.experts\.(\d+)\.`)
	fusedExpertRE = regexp.MustCompile(`\.experts\.(gate_up_proj|down_proj)$`)
)

func samePath(module string) []string { return []string{module} }

// switchMLPPath: experts are stacked into switch_mlp.
func switchMLPPath(module string) []string {
	return []string{expertRE.ReplaceAllString(module, ".switch_mlp.")}
}

// deepseekV3Path: experts are stacked into switch_mlp, and kv_b_proj is
// split into embed_q and unembed_out (deepseek_v3.py sanitize).
func deepseekV3Path(module string) []string {
	p := expertRE.ReplaceAllString(module, ".switch_mlp.")
	if base, ok := strings.CutSuffix(p, ".kv_b_proj"); ok {
		return []string{base + ".embed_q", base + ".unembed_out"}
	}
	return []string{p}
}

// qwen35MoEPath: experts stacked into switch_mlp, then qwen3_5_moe's
// sanitize moves names under language_model: model.language_model.mtp.* →
// language_model.mtp.*, model.language_model.* → language_model.model.*,
// language_model.* kept, anything else (the top-level mtp.*) under
// language_model.
func qwen35MoEPath(module string) []string {
	p := expertRE.ReplaceAllString(module, ".switch_mlp.")
	switch {
	case strings.HasPrefix(p, desc.HFLanguageModel+desc.HFMTP):
		p = desc.MLXQwen35MTP + strings.TrimPrefix(p, desc.HFLanguageModel+desc.HFMTP)
	case strings.HasPrefix(p, desc.HFLanguageModel):
		p = desc.MLXQwen35Trunk + strings.TrimPrefix(p, desc.HFLanguageModel)
	case strings.HasPrefix(p, "language_model."):
	default:
		p = "language_model." + p
	}
	return []string{p}
}
