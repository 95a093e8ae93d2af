package convert

import desc "github.com/ferry-llm/ferry/internal/family"

// qwen35moe is Qwen3_5MoeForCausalLM and the text part of
// Qwen3_5MoeForConditionalGeneration (conversion/qwen.py
// Qwen3_5MoeTextModel): qwen35 with routed experts (stacked), a shared
// expert and its gate.
type qwen35moe struct{ hybrid }

var _ family = (*qwen35moe)(nil)

func newQwen35MoE(g *desc.GGUF) family {
	return &qwen35moe{hybrid{ggufArch: g.Arch, pre: g.Pre, reorder: true, mrope: true, moe: true, names: namesOf(g)}}
}
