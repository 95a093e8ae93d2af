package convert

import desc "github.com/ferry-llm/ferry/internal/family"

// qwen3next is Qwen3NextForCausalLM (conversion/qwen.py Qwen3NextModel):
// the MoE hybrid with fused in_proj_qkvz (split into attn_qkv and
// attn_gate) and in_proj_ba (ssm_ba, unchanged); no V-head reorder and no
// M-RoPE sections.
type qwen3next struct{ hybrid }

var _ family = (*qwen3next)(nil)

func newQwen3Next(g *desc.GGUF) family {
	return &qwen3next{hybrid{ggufArch: g.Arch, pre: g.Pre, moe: true, names: namesOf(g)}}
}
