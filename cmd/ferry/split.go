package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/inputerr"
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

// withSplitParts adds to srcs, after the first part of a split GGUF
// (NAME-00001-of-0000N.gguf, a file), its other parts, by name as
// llama.cpp finds them: `ferry transfer` sends a split whole. A part that
// is missing is an error naming it.
func withSplitParts(srcs []string) ([]string, error) {
	listed := map[string]bool{}
	for _, s := range srcs {
		listed[filepath.Clean(s)] = true
	}
	var out []string
	for _, s := range srcs {
		out = append(out, s)
		_, no, count, ok := gguf.ParseSplitName(filepath.Clean(s))
		if st, err := os.Stat(s); !ok || no != 0 || count < 2 || err != nil || !st.Mode().IsRegular() {
			continue
		}
		files, _ := gguf.SplitFiles(filepath.Clean(s))
		for _, p := range files[1:] {
			if listed[p] {
				continue
			}
			if _, err := os.Stat(p); err != nil {
				return nil, inputerr.New(p, "", -1, gguf.ErrSplit, "part of the split %s (given as a source) is missing: %v", filepath.Base(s), err)
			}
			listed[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}
