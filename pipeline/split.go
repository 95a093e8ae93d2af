package pipeline

import (
	"fmt"
	"path/filepath"

	"github.com/ferry-llm/ferry/gguf"
)

// splitParams reads a GGUF-writing stage's split_max_size (N(M|G), as
// llama-gguf-split takes it: M = 1000000 bytes, G = 1000000000) and
// split_max_tensors: the output is written as the parts
// llama-gguf-split --split would cut it into. It returns the options and
// the canonical size string for the stage key ("" for none).
func splitParams(p *Params) (gguf.SplitOptions, string, error) {
	var o gguf.SplitOptions
	size, err := p.String("split_max_size", false)
	if err != nil {
		return o, "", err
	}
	if size != "" {
		if o.MaxBytes, err = gguf.ParseSplitSize(size); err != nil {
			return o, "", p.Errorf("split_max_size", "%v", err)
		}
		size = gguf.FormatSplitSize(o.MaxBytes)
	}
	n, err := p.Int("split_max_tensors", 0)
	if err != nil {
		return o, "", err
	}
	if p.Has("split_max_tensors") && n <= 0 {
		return o, "", p.Errorf("split_max_tensors", "must be a positive number, got %d", n)
	}
	o.MaxTensors = int(n)
	if err := o.Check(); err != nil {
		return o, "", p.Errorf("split_max_size", "%v", err)
	}
	return o, size, nil
}

// laterSplitPart reports whether name is a split's part other than the
// first: the first part stands for the whole split where a stage reads
// a GGUF file (verify_mtp, quantize).
func laterSplitPart(name string) bool {
	_, no, _, ok := gguf.ParseSplitName(filepath.Base(name))
	return ok && no > 0
}

// splitNote says how many parts a planned file is written as ("" for
// one file).
func splitNote(l *gguf.Layout) string {
	if l.Split == nil {
		return ""
	}
	return fmt.Sprintf(" in %d parts", len(l.Split.Parts))
}
