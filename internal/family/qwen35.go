package family

// qwen35 is Qwen3.5 and Qwen3.6 dense: the Gated-DeltaNet hybrid with a
// dense MLP, text-only (Qwen3_5ForCausalLM, model_type qwen3_5_text) or
// vision-language (Qwen3_5ForConditionalGeneration, model_type qwen3_5 with
// a qwen3_5_text text_config), its MTP head at mtp.*.
var qwen35 = Family{
	Name:       "qwen35",
	Layouts:    qwen35Layouts("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
	ModelTypes: []string{"qwen3_5_text", "qwen3_5"},
	MTP:        qwenMTP,
	GGUF: &GGUF{
		Arch:              "qwen35",
		Class:             "Qwen3_5TextModel",
		MMProjClass:       "Qwen3VLVisionModel",
		Pre:               "qwen35",
		Tensors:           join(hybridTensors, []string{"ssm_beta", "ssm_alpha", "ffn_gate", "ffn_up", "ffn_down"}),
		PostAttentionNorm: "post_attention_norm",
	},
	MLX: &MLX{
		ModelType:  "qwen3_5",
		Aliases:    []string{"qwen3_5_text"},
		Trunk:      MLXQwen35Trunk,
		Sanitize:   "qwen3_5",
		LayerOrder: HybridLayerOrder,
		// qwen3_5.py's Model serves the MoE too: its gates only when
		// num_experts > 0.
		RouterGates:            []string{"mlp.gate", "shared_expert_gate"},
		RouterGatesNeedExperts: true,
		KeepDType:              []string{"A_log"},
		RopeTypeAsType:         true,
	},
}
