package family

// qwen2 is Qwen2ForCausalLM (Qwen2, Qwen2.5): q/k/v biases.
var qwen2 = Family{
	Name:       "qwen2",
	Layouts:    []Layout{{Architecture: "Qwen2ForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"qwen2"},
	GGUF: &GGUF{
		Arch:              "qwen2",
		Class:             "Qwen2Model",
		Pre:               "qwen2",
		Tensors:           []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"},
		PostAttentionNorm: "ffn_norm",
		Quant:             QuantRules{Blocks70B: 80},
	},
	MLX: &MLX{
		ModelType:    "qwen2",
		Paths:        "same",
		Sanitize:     "simple",
		LayerOrder:   DenseLayerOrder,
		RopeTopLevel: []string{"rope_theta"},
	},
}
