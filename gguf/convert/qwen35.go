package convert

// qwen35 is Qwen3_5ForCausalLM and the text part of
// Qwen3_5ForConditionalGeneration (conversion/qwen.py Qwen3_5TextModel):
// the Gated-DeltaNet hybrid with a dense MLP, V heads reordered to tiled
// order, the MTP block kept as block num_hidden_layers.
type qwen35 struct{ hybrid }

var _ family = (*qwen35)(nil)

func newQwen35() family {
	return &qwen35{hybrid{ggufArch: "qwen35", pre: "qwen35", reorder: true, mrope: true,
		names: newNameMapper("post_attention_norm", append(hybridStems, "ssm_beta", "ssm_alpha", "ffn_gate", "ffn_up", "ffn_down")...)}}
}
