package family

// qwen3Next is Qwen3NextForCausalLM: the MoE Gated-DeltaNet hybrid with
// fused in_proj_qkvz / in_proj_ba, its MTP head counted by
// num_nextn_predict_layers.
var qwen3Next = Family{
	Name:       "qwen3next",
	Layouts:    []Layout{{Architecture: "Qwen3NextForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"qwen3_next"},
	MTP:        MTP{Convention: QwenMTP, Prefix: qwenMTP.Prefix, CountKey: "num_nextn_predict_layers"},
	GGUF: &GGUF{
		Arch:              "qwen3next",
		Class:             "Qwen3NextModel",
		Pre:               "qwen2",
		Tensors:           join([]string{"ssm_ba"}, hybridTensors, moeTensors),
		PostAttentionNorm: "post_attention_norm",
	},
	MLX: &MLX{
		ModelType:    "qwen3_next",
		Sanitize:     "qwen3_next",
		LayerOrder:   HybridLayerOrder,
		RouterGates:  []string{"mlp.gate", "shared_expert_gate"},
		RopeTopLevel: []string{"rope_theta", "partial_rotary_factor"},
	},
}
