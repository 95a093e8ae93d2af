package convert

import (
	"fmt"
	"strings"

	"github.com/ferry-llm/ferry/gguf/quant"
)

var _ quant.Policy = DefaultPolicy

// DefaultPolicy is convert_hf_to_gguf.py's type choice
// (ModelBase.prepare_tensors at 34af94c): 1-D tensors, norms, MoE routers,
// ssm_conv1d, position and token-type embeddings, and any tensor whose name
// does not end in .weight (or .lora_a/.lora_b) stay F32; everything else
// gets the requested type, except that a quantized type whose blocks do not
// divide the row falls back to F16 (gguf-py's QuantError fallback, which
// for Q8_0 means a row that is not a multiple of 32).
func DefaultPolicy(t quant.Tensor, want quant.Type) quant.Type {
	bid := blockID(t.Name)
	forced := func(stem string) bool {
		return bid >= 0 && t.Name == fmt.Sprintf("blk.%d.%s.weight", bid, stem)
	}
	switch {
	case len(t.Dims) <= 1 || strings.HasSuffix(t.Name, "_norm.weight"):
		return quant.F32
	case forced("ffn_gate_inp") || forced("ffn_gate_inp_shexp") || forced("ssm_conv1d") || t.Name == "position_embd.weight" || t.Name == "token_types.weight":
		return quant.F32
	case !hasWeightSuffix(t.Name):
		return quant.F32
	}
	if _, ok := want.RowSize(t.Dims[0]); !ok && want.BlockSize() > 1 {
		return quant.F16
	}
	return want
}

func hasWeightSuffix(name string) bool {
	if len(name) < 7 {
		return false
	}
	s := name[len(name)-7:]
	return s == ".weight" || s == ".lora_a" || s == ".lora_b"
}
