package convert

import "testing"

// Vectors from gguf-py's tests/test_metadata.py (llama.cpp 34af94c),
// test_get_model_id_components: (full name, org, basename, finetune,
// version, size label); "" stands for None.
func TestModelIDComponents(t *testing.T) {
	tests := []struct {
		id    string
		total int64
		want  [6]string
	}{
		{"Mistral/Mixtral-8x7B-Instruct-v0.1", 0, [6]string{"Mixtral-8x7B-Instruct-v0.1", "Mistral", "Mixtral", "Instruct", "v0.1", "8x7B"}},
		{"Mixtral-8x7B-Instruct-v0.1", 0, [6]string{"Mixtral-8x7B-Instruct-v0.1", "", "Mixtral", "Instruct", "v0.1", "8x7B"}},
		{"Mixtral-8x7B-Instruct", 0, [6]string{"Mixtral-8x7B-Instruct", "", "Mixtral", "Instruct", "", "8x7B"}},
		{"Mixtral-8x7B-v0.1", 0, [6]string{"Mixtral-8x7B-v0.1", "", "Mixtral", "", "v0.1", "8x7B"}},
		{"Mixtral-8x7B", 0, [6]string{"Mixtral-8x7B", "", "Mixtral", "", "", "8x7B"}},
		{"Mixtral-v0.1", 0, [6]string{"Mixtral-v0.1", "", "Mixtral", "", "v0.1", ""}},
		{"Mixtral", 0, [6]string{"Mixtral", "", "", "", "", ""}},
		{"NousResearch/Meta-Llama-3-8B", 0, [6]string{"Meta-Llama-3-8B", "NousResearch", "Meta-Llama-3", "", "", "8B"}},
		{"Qwen1.5-MoE-A2.7B-Chat", 0, [6]string{"Qwen1.5-MoE-A2.7B-Chat", "", "Qwen1.5-MoE", "Chat", "", "A2.7B"}},
		{"Qwen2-57B-A14B-Instruct", 0, [6]string{"Qwen2-57B-A14B-Instruct", "", "Qwen2", "Instruct", "", "57B-A14B"}},
		{"microsoft/Phi-3-mini-4k-instruct", 4000000000, [6]string{"Phi-3-mini-4k-instruct", "microsoft", "Phi-3", "4k-instruct", "", "mini"}},
		{"delphi-suite/stories-llama2-50k", 50000, [6]string{"stories-llama2-50k", "delphi-suite", "stories-llama2", "", "", "50K"}},
		{"DeepSeek-Coder-V2-Lite-Instruct", 0, [6]string{"DeepSeek-Coder-V2-Lite-Instruct", "", "DeepSeek-Coder-V2-Lite", "Instruct", "", ""}},
		{"crestf411/daybreak-kunoichi-2dpo-7b", 0, [6]string{"daybreak-kunoichi-2dpo-7b", "crestf411", "daybreak-kunoichi", "2dpo", "", "7B"}},
		{"Qwen2-0.5B-Instruct", 0, [6]string{"Qwen2-0.5B-Instruct", "", "Qwen2", "Instruct", "", "0.5B"}},
		{"smallcloudai/Refact-1_6B-fim", 0, [6]string{"Refact-1_6B-fim", "smallcloudai", "Refact", "fim", "", "1.6B"}},
		{"UCLA-AGI/Gemma-2-9B-It-SPPO-Iter3", 0, [6]string{"Gemma-2-9B-It-SPPO-Iter3", "UCLA-AGI", "Gemma-2", "It-SPPO", "Iter3", "9B"}},
		{"NousResearch/Hermes-2-Theta-Llama-3-8B", 0, [6]string{"Hermes-2-Theta-Llama-3-8B", "NousResearch", "Hermes-2-Theta-Llama-3", "", "", "8B"}},
		{"SeaLLMs/SeaLLMs-v3-7B-Chat", 0, [6]string{"SeaLLMs-v3-7B-Chat", "SeaLLMs", "SeaLLMs-v3", "Chat", "", "7B"}},
		{"internlm/internlm2_5-7b-chat-1m", 7000000000, [6]string{"internlm2_5-7b-chat-1m", "internlm", "internlm2_5", "chat-1m", "", "7B"}},
		{"pszemraj/jamba-900M-v0.13-KIx2", 0, [6]string{"jamba-900M-v0.13-KIx2", "pszemraj", "jamba", "KIx2", "v0.13", "900M"}},
		{"state-spaces/mamba-2.8b-hf", 0, [6]string{"mamba-2.8b-hf", "state-spaces", "mamba", "hf", "", "2.8B"}},
		{"abacaj/llama-161M-100B", 161000000, [6]string{"llama-161M-100B", "abacaj", "llama", "100b", "", "161M"}},
		{"SparseLLM/relu-100B", 1340000000, [6]string{"relu-100B", "SparseLLM", "relu", "100b", "", ""}},
		{"bigscience/bloom-7b1-petals", 0, [6]string{"bloom-7b1-petals", "bigscience", "bloom", "petals", "", "7.1B"}},
		{"MaziyarPanahi/GreenNode-mini-7B-multilingual-v1olet-Mistral-7B-Instruct-v0.1", 0, [6]string{"GreenNode-mini-7B-multilingual-v1olet-Mistral-7B-Instruct-v0.1", "MaziyarPanahi", "GreenNode-mini", "multilingual-v1olet-Mistral-Instruct", "v0.1", "7B"}},
		{"mistralai/Mistral-Nemo-Instruct-2407", 0, [6]string{"Mistral-Nemo-Instruct-2407", "mistralai", "Mistral-Nemo", "Instruct", "2407", ""}},
		{"deepseek-ai/DeepSeek-V2-Chat-0628", 0, [6]string{"DeepSeek-V2-Chat-0628", "deepseek-ai", "DeepSeek-V2", "Chat", "0628", ""}},
		{"OpenGVLab/Mini-InternVL-Chat-2B-V1-5", 0, [6]string{"Mini-InternVL-Chat-2B-V1-5", "OpenGVLab", "Mini-InternVL", "Chat", "V1-5", "2B"}},
		{"jondurbin/bagel-dpo-2.8b-v0.2", 0, [6]string{"bagel-dpo-2.8b-v0.2", "jondurbin", "bagel-dpo", "", "v0.2", "2.8B"}},
		{"voxmenthe/SFR-Iterative-DPO-LLaMA-3-8B-R-unquantized", 0, [6]string{"SFR-Iterative-DPO-LLaMA-3-8B-R-unquantized", "voxmenthe", "SFR-Iterative-DPO-LLaMA-3", "R-unquantized", "", "8B"}},
		{"microsoft/Florence-2-base", 0, [6]string{"Florence-2-base", "microsoft", "", "", "", ""}},
		{"mistralai/-Mistral--Nemo-Base-2407-", 0, [6]string{"-Mistral--Nemo-Base-2407-", "mistralai", "Mistral-Nemo-Base", "", "2407", ""}},
		{"Llama-3-Instruct-abliteration-LoRA-8B", 0, [6]string{"Llama-3-Instruct-abliteration-LoRA-8B", "", "Llama-3", "Instruct-abliteration-LoRA", "", "8B"}},
		{"Llama-3-Instruct-abliteration-LoRA-8B", -1234, [6]string{"Llama-3-Instruct-abliteration-LoRA-8B", "", "Llama-3", "Instruct-abliteration", "", "8B"}},
	}
	for _, tt := range tests {
		c := modelIDComponents(tt.id, tt.total, true)
		got := [6]string{c.full, c.org, c.basename, c.finetune, c.version, c.sizeLabel}
		if got != tt.want {
			t.Errorf("%q (%d): got %q, want %q", tt.id, tt.total, got, tt.want)
		}
	}
}

func TestIDToTitleAndSizeLabel(t *testing.T) {
	for in, want := range map[string]string{"base": "Base", "qwen3.5-27b": "Qwen3.5 27b", "Qwen3.5-27B": "Qwen3.5 27B", "my-model-v2": "My Model v2", "abc1def": "Abc1Def"} {
		if got := idToTitle(in); got != want {
			t.Errorf("idToTitle(%q) = %q, want %q", in, got, want)
		}
	}
	for _, c := range []struct {
		total, shared, expert, n int64
		want                     string
	}{{3686616, 0, 0, 0, "3.7M"}, {1312256, 0, 0, 0, "1.3M"}, {26_895_998_464, 0, 0, 0, "27B"}, {999, 0, 0, 0, "1.0K"}, {0, 91072, 12288, 4, "4x103K"}} {
		if got := sizeLabel(c.total, c.shared, c.expert, c.n); got != c.want {
			t.Errorf("sizeLabel(%d, %d, %d, %d) = %q, want %q", c.total, c.shared, c.expert, c.n, got, c.want)
		}
	}
}
