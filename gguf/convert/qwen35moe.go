package convert

// qwen35moe is Qwen3_5MoeForCausalLM and the text part of
// Qwen3_5MoeForConditionalGeneration (conversion/qwen.py
// Qwen3_5MoeTextModel): qwen35 with routed experts (stacked), a shared
// expert and its gate.
type qwen35moe struct{ hybrid }

var _ family = (*qwen35moe)(nil)

func newQwen35MoE() family {
	return &qwen35moe{hybrid{ggufArch: "qwen35moe", pre: "qwen35", reorder: true, mrope: true, moe: true,
		names: newNameMapper("post_attention_norm", append(append([]string{"ssm_beta", "ssm_alpha"}, hybridStems...), moeStems...)...)}}
}
