package family

// qwen3 is Qwen3ForCausalLM: Qwen2 without biases, with q_norm/k_norm.
var qwen3 = Family{
	Name:       "qwen3",
	Layouts:    []Layout{{Architecture: "Qwen3ForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"qwen3"},
	GGUF: &GGUF{
		Arch:              "qwen3",
		Class:             "Qwen3Model",
		Pre:               "qwen2",
		Tensors:           []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down"},
		PostAttentionNorm: "ffn_norm",
	},
	MLX: &MLX{
		ModelType:    "qwen3",
		Paths:        "same",
		Sanitize:     "simple",
		LayerOrder:   DenseLayerOrder,
		RopeTopLevel: []string{"rope_theta"},
	},
}
