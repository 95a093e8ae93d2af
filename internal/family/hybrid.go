package family

// The Gated-DeltaNet hybrids (Qwen3-Next, Qwen3.5): GGUF block tensors they
// share (gguf-py MODEL_TENSORS), the NextN block's included.
var hybridTensors = []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
	"attn_qkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_norm", "ssm_out",
	"nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"}

// The routed and shared experts' GGUF tensors.
var moeTensors = []string{"ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp"}

func join(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// qwenMTP is the head of Qwen3.5 and Qwen3.6: mtp.* at the top level (in
// both layouts), counted by mtp_num_hidden_layers, kept by mlx quantize
// --keep-mtp under mlx-lm PR #990's names.
var qwenMTP = MTP{Convention: QwenMTP, Prefix: HFMTP, CountKey: "mtp_num_hidden_layers", MLXPrefix: MLXQwen35MTP}

// qwen35Layouts are Qwen3.5's text-only and vision-language layouts.
func qwen35Layouts(causal, condGen string) []Layout {
	return []Layout{
		{Architecture: causal, Trunk: HFTrunk},
		{Architecture: condGen, Vision: true, TextConfig: true, Trunk: HFLanguageModel, VisionTower: HFVisual},
	}
}
