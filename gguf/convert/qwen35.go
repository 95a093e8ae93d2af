package convert

import desc "github.com/ferry-llm/ferry/internal/family"

// qwen35 is Qwen3_5ForCausalLM and the text part of
// Qwen3_5ForConditionalGeneration (conversion/qwen.py Qwen3_5TextModel):
// the Gated-DeltaNet hybrid with a dense MLP, V heads reordered to tiled
// order, the MTP block kept as block num_hidden_layers.
type qwen35 struct{ hybrid }

var _ family = (*qwen35)(nil)

func newQwen35(g *desc.GGUF) family {
	return &qwen35{hybrid{ggufArch: g.Arch, pre: g.Pre, reorder: true, mrope: true, names: namesOf(g)}}
}
