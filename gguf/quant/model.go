package quant

import (
	"fmt"

	"github.com/ferry-llm/ferry/internal/family"
)

// ModelFromKV reads a Model from a GGUF's KVs as llama.cpp's loader does
// (for an arch whose loader reads no hyperparameters, LLM_ARCH_CLIP, "only
// used by llama-quantize", the arch of a multimodal projector: nothing but
// the architecture, every count 0; internal/family QuantRules.NoHParams).
// lookup returns a key's value as package gguf holds it: a Go scalar
// (string, uint32, …), or for an ARRAY its typed slice ([]uint32, []int32,
// …), and false when the key is absent. As in llama.cpp, block_count and
// expert_count must be UINT32, and a per-block head count array must
// hold UINT32, INT32 or BOOL values, one per block.
func ModelFromKV(lookup func(key string) (any, bool)) (Model, error) {
	var m Model
	v, ok := lookup("general.architecture")
	if m.Arch, _ = v.(string); !ok || m.Arch == "" {
		return m, fmt.Errorf("general.architecture: missing or not a string")
	}
	u32 := func(key string, required bool) (uint32, error) {
		v, ok := lookup(key)
		if !ok {
			if required {
				return 0, fmt.Errorf("%s: missing", key)
			}
			return 0, nil
		}
		n, ok := v.(uint32)
		if !ok {
			return 0, fmt.Errorf("%s: %T, want a UINT32", key, v)
		}
		return n, nil
	}
	if family.QuantRulesOf(m.Arch).NoHParams {
		// llama_model_base::load_hparams stops after general.name for a
		// CLIP file: every count stays 0.
		return m, nil
	}
	var err error
	if m.NLayerAll, err = u32(m.Arch+".block_count", true); err != nil {
		return m, err
	}
	if m.NExpert, err = u32(m.Arch+".expert_count", false); err != nil {
		return m, err
	}
	// The first block's head counts: a scalar is every block's.
	first := func(key string, def uint32) (uint32, error) {
		v, ok := lookup(key)
		if !ok {
			return def, nil
		}
		var vals []uint32
		switch a := v.(type) {
		case uint32:
			return a, nil
		case []uint32:
			vals = a
		case []int32:
			for _, x := range a {
				vals = append(vals, uint32(x))
			}
		case []bool:
			for _, x := range a {
				vals = append(vals, map[bool]uint32{false: 0, true: 1}[x])
			}
		default:
			return 0, fmt.Errorf("%s: %T, want a UINT32 or an array of UINT32, INT32 or BOOL", key, v)
		}
		if len(vals) == 0 || len(vals) != int(m.NLayerAll) {
			return 0, fmt.Errorf("%s: %d values for %d blocks", key, len(vals), m.NLayerAll)
		}
		return vals[0], nil
	}
	if m.NHead, err = first(m.Arch+".attention.head_count", 0); err != nil {
		return m, err
	}
	if m.NHeadKV, err = first(m.Arch+".attention.head_count_kv", m.NHead); err != nil {
		return m, err
	}
	return m, nil
}
