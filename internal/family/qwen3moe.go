package family

// qwen3MoE is Qwen3MoeForCausalLM: Qwen3 with routed experts (a router
// mlp.gate, per-expert projections) and an optional shared expert.
var qwen3MoE = Family{
	Name:       "qwen3moe",
	Layouts:    []Layout{{Architecture: "Qwen3MoeForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"qwen3_moe"},
	GGUF: &GGUF{
		Arch:  "qwen3moe",
		Class: "Qwen3MoeModel",
		Pre:   "qwen2",
		Tensors: []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
			"ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
			"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"},
		PostAttentionNorm: "ffn_norm",
	},
	MLX: &MLX{
		ModelType:     "qwen3_moe",
		StacksExperts: true,
		Paths:         "switch_mlp",
		Sanitize:      "qwen3_moe",
		LayerOrder:    []string{"self_attn", "input_layernorm", "post_attention_layernorm", "mlp"},
		RouterGates:   []string{"mlp.gate"},
		RopeTopLevel:  []string{"rope_theta"},
	},
}
