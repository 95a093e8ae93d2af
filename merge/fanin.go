package merge

import (
	"fmt"
	"strings"
)

// fan_in_fan_out. PEFT decides it per module from the layer's class, not
// from the config: a torch.nn.Linear (weight stored [out, in]) is merged
// with fan_in_fan_out false, a transformers Conv1D (GPT-2 style, weight
// stored [in, out]) with fan_in_fan_out true, and a config saying
// otherwise only gets a warning (peft/tuners/lora/model.py,
// dispatch_default: "fan_in_fan_out is set to True but the target module
// is `torch.nn.Linear`. Setting fan_in_fan_out to False." and the converse
// for Conv1D). A checkpoint does not name classes, so ferry tells them
// apart by shape: A is [r, in] and B is [out, r] for both, so the base
// weight is [out, in] (Linear) or [in, out] (Conv1D). Only a square weight
// fits both; then the model family decides, as it decides the class in
// transformers.

// conv1DFamilies are the config.json model_types whose modeling code builds
// transformers.pytorch_utils.Conv1D layers, and conv1DModules the module
// names those layers have there (GPT2Attention.c_attn / q_attn / c_proj,
// GPT2MLP.c_fc / c_proj, and the copies in the other families).
var (
	conv1DFamilies = map[string]bool{"gpt2": true, "openai-gpt": true, "imagegpt": true, "decision_transformer": true, "clvp": true, "clvp_decoder": true}
	conv1DModules  = map[string]bool{"c_attn": true, "q_attn": true, "c_proj": true, "c_fc": true}
)

// layerKinds decides each Linear-kind module's layout and collects the
// warnings for modules whose layout differs from the config's flag.
type layerKinds struct {
	modelType string
	flag      bool     // adapter_config.json fan_in_fan_out
	reset     []string // modules whose layout is not what the flag says
}

// fanInFanOut reports whether module m, whose base weight is rows×cols and
// whose factors are A (aShape) and B (bShape), is a Conv1D layer (merged
// with fan_in_fan_out). When neither layout fits the shapes it returns the
// config's flag, and the shape checks report the mismatch.
func (k *layerKinds) fanInFanOut(m string, aShape, bShape []int64, rows, cols int64) bool {
	if len(aShape) != 2 || len(bShape) != 2 {
		return k.flag
	}
	in, out := aShape[1], bShape[0]
	linear := rows == out && cols == in
	conv1D := rows == in && cols == out
	var is bool
	switch {
	case linear && conv1D: // square: the family decides
		is = conv1DFamilies[k.modelType] && conv1DModules[m[strings.LastIndexByte(m, '.')+1:]]
	case linear:
		is = false
	case conv1D:
		is = true
	default:
		return k.flag
	}
	if is != k.flag {
		k.reset = append(k.reset, m)
	}
	return is
}

// warnings is one line for all the modules whose layout overrode the flag.
func (k *layerKinds) warnings() []string {
	if len(k.reset) == 0 {
		return nil
	}
	if k.flag {
		return []string{fmt.Sprintf("fan_in_fan_out is set to True but %d target modules are torch.nn.Linear (weights stored [out, in]: %s); they are merged with fan_in_fan_out False, as PEFT does", len(k.reset), listSome(k.reset, 3))}
	}
	return []string{fmt.Sprintf("fan_in_fan_out is set to False but %d target modules are Conv1D (weights stored [in, out]: %s); they are merged with fan_in_fan_out True, as PEFT does", len(k.reset), listSome(k.reset, 3))}
}
