// Command testmodel writes the tiny checkpoints of
// testmodel.ConverterFamilies, each with its tokenizer, one directory per
// family, for running reference tools (llama.cpp's convert_hf_to_gguf.py)
// on exactly the inputs the golden tests regenerate, and on request the
// compressed-tensors checkpoints the mlxpack tests repack (ct-*, for
// loading ferry mlx repack outputs with the real mlx-lm), and the
// vision-language sets qwen35-vl and qwen35moe-vl (base/ and adapter-dora/):
//
//	go run ./internal/testmodel/cmd/testmodel OUTDIR [FAMILY...]
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// vlSets are the vision-language sets (base/ and adapter-dora/), written
// only when named; qwen35moe-vl is the one mlx-lm 0.32 converted and loaded
// in mlxpack/testdata/qwen35vl_mlx (Qwen35MoEVLDevice).
var vlSets = map[string]func(dir string) (*testmodel.VLSet, error){
	"qwen35-vl": func(dir string) (*testmodel.VLSet, error) {
		return testmodel.Qwen35VL(dir, testmodel.Qwen35Options{Common: testmodel.Common{Seed: 5}})
	},
	"qwen35moe-vl": func(dir string) (*testmodel.VLSet, error) {
		return testmodel.Qwen35MoEVL(dir, testmodel.Qwen35MoEVLDevice)
	},
}

// compressed are the compressed-tensors checkpoints (seed 1), written
// only when named.
var compressed = map[string]func() *testmodel.CompressedCheckpoint{
	"ct-deepseek_v3": func() *testmodel.CompressedCheckpoint { return testmodel.CompressedDeepSeekV3(1) },
	"ct-qwen3":       func() *testmodel.CompressedCheckpoint { return testmodel.CompressedQwen3(1) },
	"ct-qwen3_moe":   func() *testmodel.CompressedCheckpoint { return testmodel.CompressedQwen3MoE(1) },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintf(os.Stderr, "usage: testmodel OUTDIR [FAMILY...]\nfamilies: %v\n", testmodel.ConverterFamilyNames())
		os.Exit(2)
	}
	families := os.Args[2:]
	if len(families) == 0 {
		families = testmodel.ConverterFamilyNames()
	}
	for _, name := range families {
		if vl, ok := vlSets[name]; ok {
			dir := filepath.Join(os.Args[1], name)
			if _, err := vl(dir); err != nil {
				fmt.Fprintf(os.Stderr, "testmodel: %s: %v\n", name, err)
				os.Exit(1)
			}
			fmt.Println(dir)
			continue
		}
		if ct, ok := compressed[name]; ok {
			dir := filepath.Join(os.Args[1], name)
			if err := ct().Write(dir); err != nil {
				fmt.Fprintf(os.Stderr, "testmodel: %s: %v\n", name, err)
				os.Exit(1)
			}
			fmt.Println(dir)
			continue
		}
		write, ok := testmodel.ConverterFamilies[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "testmodel: unknown family %q (have %v, ct-deepseek_v3, ct-qwen3, ct-qwen3_moe, qwen35-vl and qwen35moe-vl)\n", name, testmodel.ConverterFamilyNames())
			os.Exit(2)
		}
		dir := filepath.Join(os.Args[1], name)
		if _, err := write(dir); err != nil {
			fmt.Fprintf(os.Stderr, "testmodel: %s: %v\n", name, err)
			os.Exit(1)
		}
		fmt.Println(dir)
	}
}
