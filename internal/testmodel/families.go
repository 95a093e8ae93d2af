package testmodel

import "sort"

// ConverterFamilies are the tiny checkpoints (defaults, seed 11, with a
// tokenizer) that llama.cpp's convert_hf_to_gguf.py was run on to make the
// per-family goldens in gguf/convert/testdata/families: one per
// architecture the converter supports beyond the two reference models.
// The golden test regenerates each input from this table and checks its
// shard digests against the ones recorded beside the golden, so a change
// here cannot silently compare a conversion with the wrong golden.
// cmd/testmodel writes them for the tool run.
var ConverterFamilies = map[string]func(dir string) (*Model, error){
	"llama": func(dir string) (*Model, error) {
		return LlamaOptions{Common{Seed: 11}}.Write(dir)
	},
	"qwen2": func(dir string) (*Model, error) {
		return Qwen2Options{Common{Seed: 11}}.Write(dir)
	},
	"qwen3moe": func(dir string) (*Model, error) {
		return Qwen3MoEOptions{Common: Common{Seed: 11}}.Write(dir)
	},
	"qwen35moe": func(dir string) (*Model, error) {
		return Qwen35MoEOptions{Common: Common{Seed: 11}}.Write(dir)
	},
	"qwen35moe-fused": func(dir string) (*Model, error) {
		return Qwen35MoEOptions{Common: Common{Seed: 11}, MoE: MoE{FusedExperts: true}}.Write(dir)
	},
	"qwen35-condgen": func(dir string) (*Model, error) {
		return Qwen35Options{Common: Common{Seed: 11}, ConditionalGeneration: true}.Write(dir)
	},
	"qwen3next": func(dir string) (*Model, error) {
		return Qwen3NextOptions{Common: Common{Seed: 11}}.Write(dir)
	},
}

// ConverterFamilyNames lists ConverterFamilies' keys in order.
func ConverterFamilyNames() []string {
	var names []string
	for n := range ConverterFamilies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// QuantizerFamilies are the checkpoints whose F16 GGUFs (ferry's
// conversion, byte-identical to the converter's for the ConverterFamilies)
// llama-quantize was run on for gguf/quant/testdata/golden/families: the
// ConverterFamilies (rows of 64 and 128, so every K type falls back to a
// legacy one; MoE with and without MTP) and three shapes made for the
// type rules: rows of 80 in every tensor (llama-quantize refuses: nothing
// of 32 divides output.weight), ffn_down rows of 80 (the K types fall back
// to F16 there, Q8_0 and the legacy types refuse), and nine layers with
// four query heads per KV head (the use_more_bits and n_gqa rules).
var QuantizerFamilies = func() map[string]func(dir string) (*Model, error) {
	m := map[string]func(dir string) (*Model, error){
		"llama-w80": func(dir string) (*Model, error) {
			return LlamaOptions{Common{Seed: 21, HiddenSize: 80, IntermediateSize: 160, NumHeads: 4, NumKVHeads: 1, HeadDim: 20, NumLayers: 2, VocabSize: 320}}.Write(dir)
		},
		"llama-i80": func(dir string) (*Model, error) {
			return LlamaOptions{Common{Seed: 23, HiddenSize: 64, IntermediateSize: 80, NumHeads: 4, NumKVHeads: 2, HeadDim: 16, NumLayers: 2, VocabSize: 320}}.Write(dir)
		},
		"qwen3-l9": func(dir string) (*Model, error) {
			return Qwen3Options{Common{Seed: 22, HiddenSize: 64, IntermediateSize: 128, NumHeads: 8, NumKVHeads: 2, HeadDim: 8, NumLayers: 9, VocabSize: 320}}.Write(dir)
		},
	}
	for k, f := range ConverterFamilies {
		m[k] = f
	}
	return m
}()
