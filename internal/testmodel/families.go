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
