package main

import (
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
)

// splitFlags are llama-gguf-split --split's limits, for the commands that
// write a GGUF file (gguf convert, quantize).
func splitFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "split-max-size", Usage: "write the output as parts of at most `N(M|G)` tensor bytes each (M = 1000000, G = 1000000000 bytes, as llama-gguf-split counts them): OUT-00001-of-0000N.gguf …, the parts llama-gguf-split --split --split-max-size N makes of the unsplit file, byte for byte (Hugging Face takes files up to 50G)"},
		&cli.IntFlag{Name: "split-max-tensors", Usage: "write the output as parts of at most `N` tensors each, as llama-gguf-split --split --split-max-tensors N"},
	}
}

// splitOptionsOf reads the split flags.
func splitOptionsOf(c *cli.Context) (gguf.SplitOptions, error) {
	var o gguf.SplitOptions
	name := commandPath(c)
	if c.IsSet("split-max-size") {
		n, err := gguf.ParseSplitSize(c.String("split-max-size"))
		if err != nil {
			return o, usageErrorf("%s: --split-max-size: %v", name, err)
		}
		o.MaxBytes = n
	}
	if c.IsSet("split-max-tensors") {
		o.MaxTensors = c.Int("split-max-tensors")
		if o.MaxTensors <= 0 {
			return o, usageErrorf("%s: --split-max-tensors %d: want a positive number", name, o.MaxTensors)
		}
	}
	if err := o.Check(); err != nil {
		return o, usageErrorf("%s: --split-max-size and --split-max-tensors: %v", name, err)
	}
	return o, nil
}

// printSplitFiles lists a split output's parts.
func printSplitFiles(w io.Writer, files []string) {
	if len(files) == 0 {
		return
	}
	fmt.Fprintf(w, "  in %d parts:", len(files))
	for _, f := range files {
		fmt.Fprintf(w, " %s", f)
	}
	fmt.Fprintln(w)
}
