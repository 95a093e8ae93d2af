package family

// llama is LlamaForCausalLM (and, for mlx-lm, Mistral, which it loads with
// its llama model).
var llama = Family{
	Name:       "llama",
	Layouts:    []Layout{{Architecture: "LlamaForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"llama"},
	GGUF: &GGUF{
		Arch:              "llama",
		Class:             "LlamaModel",
		Pre:               "llama-bpe",
		Tensors:           []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"},
		PostAttentionNorm: "ffn_norm",
		// load_arch_hparams: 80 blocks with grouped KV heads, not an
		// 8-expert model.
		Quant: QuantRules{Blocks70B: 80, Llama70B: true},
	},
	MLX: &MLX{
		ModelType:    "llama",
		Remapped:     []string{"mistral"},
		Paths:        "same",
		Sanitize:     "simple",
		LayerOrder:   DenseLayerOrder,
		RopeTopLevel: []string{"rope_theta"},
	},
}
