package family

// qwen35MoE is Qwen3.5 and Qwen3.6 MoE: Qwen35 with routed experts
// (per-expert or fused gate_up_proj), a shared expert and its gate.
var qwen35MoE = Family{
	Name:       "qwen35moe",
	Layouts:    qwen35Layouts("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
	ModelTypes: []string{"qwen3_5_moe_text", "qwen3_5_moe"},
	MTP:        qwenMTP,
	GGUF: &GGUF{
		Arch:              "qwen35moe",
		Class:             "Qwen3_5MoeTextModel",
		MMProjClass:       "Qwen3VLVisionModel",
		Pre:               "qwen35",
		Tensors:           join([]string{"ssm_beta", "ssm_alpha"}, hybridTensors, moeTensors),
		PostAttentionNorm: "post_attention_norm",
	},
	MLX: &MLX{
		ModelType:      "qwen3_5_moe",
		Aliases:        []string{"qwen3_5_moe_text"},
		StacksExperts:  true,
		Paths:          "qwen3_5_moe",
		Trunk:          MLXQwen35Trunk,
		Sanitize:       "qwen3_5_moe",
		LayerOrder:     HybridLayerOrder,
		RouterGates:    []string{"mlp.gate", "shared_expert_gate"},
		KeepDType:      []string{"A_log"},
		RopeTypeAsType: true,
	},
}
