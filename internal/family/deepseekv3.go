package family

// deepseekV3 is DeepSeek-V3 and the models mlx-lm loads with its model
// (Kimi K2, K2.5, JoyAI-LLM-Flash): ferry repacks their compressed-tensors
// checkpoints for MLX; their MTP head is extra decoder layers.
var deepseekV3 = Family{
	Name:       "deepseekv3",
	Layouts:    []Layout{{Architecture: "DeepseekV3ForCausalLM", Trunk: HFTrunk}},
	ModelTypes: []string{"deepseek_v3"},
	MTP:        MTP{Convention: NextNLayer, CountKey: "num_nextn_predict_layers"},
	MLX: &MLX{
		ModelType: "deepseek_v3",
		// utils.MODEL_REMAPPING sends kimi_k2 and joyai_llm_flash to
		// deepseek_v3; kimi_k25's sanitize calls DeepseekV3's on its
		// language model.
		Remapped:      []string{"kimi_k2", "kimi_k25", "joyai_llm_flash"},
		RenamesPacked: true,
		StacksExperts: false,
		Paths:         "deepseek_v3",
	},
}
