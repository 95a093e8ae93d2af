package mlxpack

import (
	"regexp"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/modulepaths"
)

// family is what ferry knows of one mlx-lm model type: what its sanitize()
// does to a checkpoint's names (mlx-lm d78bf58e, mlx_lm/models/<type>.py).
// MLX quantization extends it with what it must know per family.
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

// families is keyed by config.json model_type. Adding a family is adding an
// entry here (and a path mapping below when its sanitize renames modules),
// with a case in TestMLXPaths.
var families = map[string]family{
	// sanitize keeps module paths as they are (it only drops a tied
	// lm_head or rotary buffers).
	"llama": {paths: samePath},
	"qwen2": {paths: samePath},
	"qwen3": {paths: samePath},

	"qwen3_moe":   {stacksExperts: true, paths: switchMLPPath},
	"qwen3_5_moe": {stacksExperts: true, paths: qwen35MoEPath},

	// utils.MODEL_REMAPPING sends kimi_k2 and joyai_llm_flash to
	// deepseek_v3; kimi_k25's sanitize calls DeepseekV3's on its language
	// model.
	"deepseek_v3":     deepseekV3,
	"kimi_k2":         deepseekV3,
	"kimi_k25":        deepseekV3,
	"joyai_llm_flash": deepseekV3,
}

var deepseekV3 = family{renamesPacked: true, paths: deepseekV3Path}

// familyOf is the family of a model type; the zero family (nothing
// renamed, no known paths) for a type ferry does not know.
func familyOf(modelType string) family { return families[modelType] }

// familyTypes lists, sorted and comma-separated, the model types whose
// family satisfies keep (for messages).
func familyTypes(keep func(family) bool) string {
	var t []string
	for k, f := range families {
		if keep(f) {
			t = append(t, k)
		}
	}
	sort.Strings(t)
	return strings.Join(t, ", ")
}

// mlxPaths maps a checkpoint module to the module path(s) mlx-lm's model
// has after sanitize. ok is false if ferry does not know the mapping for
// this model type (the module is returned as it is).
func mlxPaths(modelType, module string) (paths []string, ok bool) {
	f, ok := families[modelType]
	if !ok || f.paths == nil {
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
	case strings.HasPrefix(p, modulepaths.HFLanguageModel+modulepaths.HFMTP):
		p = modulepaths.MLXQwen35MTP + strings.TrimPrefix(p, modulepaths.HFLanguageModel+modulepaths.HFMTP)
	case strings.HasPrefix(p, modulepaths.HFLanguageModel):
		p = modulepaths.MLXQwen35Trunk + strings.TrimPrefix(p, modulepaths.HFLanguageModel)
	case strings.HasPrefix(p, "language_model."):
	default:
		p = "language_model." + p
	}
	return []string{p}
}
