// Command testmodel writes the tiny checkpoints of
// testmodel.ConverterFamilies, each with its tokenizer, one directory per
// family, for running reference tools (llama.cpp's convert_hf_to_gguf.py)
// on exactly the inputs the golden tests regenerate:
//
//	go run ./internal/testmodel/cmd/testmodel OUTDIR [FAMILY...]
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

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
		write, ok := testmodel.ConverterFamilies[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "testmodel: unknown family %q (have %v)\n", name, testmodel.ConverterFamilyNames())
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
