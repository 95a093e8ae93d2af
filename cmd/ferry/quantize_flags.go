package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
)

// repeated is a repeatable string flag that keeps each value whole (a
// StringSliceFlag would split a regular expression at its commas).
type repeated []string

func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }
func (r *repeated) String() string     { return strings.Join(*r, " ") }

func repeatedOf(c *cli.Context, name string) []string {
	if r, ok := c.Generic(name).(*repeated); ok && r != nil {
		return *r
	}
	return nil
}

// quantizeOptionFlags are llama-quantize's flags that shape a
// quantization beyond its file type, and ferry's --mtp-type; every
// command that quantizes takes them (quantizeOptions reads them).
func quantizeOptionFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "imatrix", Usage: "importance matrix `FILE` (llama-imatrix's GGUF or legacy .dat output, told apart by content): quantize with the weighted paths; its name as given is written as quantize.imatrix.file"},
		&cli.GenericFlag{Name: "include-weights", Value: &repeated{}, Usage: "use only the matrix entries whose names contain `NAME` (repeatable; not with --exclude-weights)"},
		&cli.GenericFlag{Name: "exclude-weights", Value: &repeated{}, Usage: "drop the matrix entries whose names contain `NAME` (repeatable; not with --include-weights)"},
		&cli.GenericFlag{Name: "tensor-type", Value: &repeated{}, Usage: "tensors whose names match `REGEX=TYPE`'s REGEX (lower-cased, anywhere in the name) get ggml TYPE instead of the mix's choice; the first match wins (repeatable)"},
		&cli.StringFlag{Name: "output-tensor-type", Usage: "ggml `TYPE` for output.weight (e.g. q8_0)"},
		&cli.StringFlag{Name: "token-embedding-type", Usage: "ggml `TYPE` for token_embd.weight (e.g. q8_0)"},
		&cli.BoolFlag{Name: "leave-output-tensor", Usage: "leave output.weight as it is in the input"},
		&cli.BoolFlag{Name: "pure", Usage: "give every quantized tensor TYPE's default type (no mix, no larger types)"},
		&cli.StringFlag{Name: "mtp-type", Usage: "ggml `TYPE` for every quantizable tensor of the NextN/MTP block (e.g. q8_0; its norms stay F32); not a llama-quantize flag"},
		&cli.BoolFlag{Name: "allow-requantize", Usage: "quantize tensors that are already quantized (decoded first; quality suffers)"},
	}
}

// quantizeOptions reads quantizeOptionFlags into options (every field but
// FileType), opening and filtering the importance matrix. Errors are
// usage errors (exit 2), or the matrix's own bad-input errors.
func quantizeOptions(c *cli.Context) (quantize.Options, error) {
	var o quantize.Options
	name := commandPath(c)
	for _, f := range []struct {
		flag string
		dst  **quant.Type
	}{{"output-tensor-type", &o.OutputType}, {"token-embedding-type", &o.TokenEmbdType}, {"mtp-type", &o.MTPType}} {
		if !c.IsSet(f.flag) {
			continue
		}
		t, err := quantize.ParseTensorTypeName(c.String(f.flag))
		if err != nil {
			return o, usageErrorf("%s: --%s: %v", name, f.flag, err)
		}
		*f.dst = &t
	}
	for _, s := range repeatedOf(c, "tensor-type") {
		tt, err := quantize.ParseTensorType(s)
		if err != nil {
			return o, usageErrorf("%s: %v", name, err)
		}
		o.TensorTypes = append(o.TensorTypes, tt)
	}
	o.AllowRequantize, o.LeaveOutput, o.Pure = c.Bool("allow-requantize"), c.Bool("leave-output-tensor"), c.Bool("pure")
	include, exclude := repeatedOf(c, "include-weights"), repeatedOf(c, "exclude-weights")
	switch {
	case len(include) > 0 && len(exclude) > 0:
		return o, usageErrorf("%s: --include-weights and --exclude-weights cannot be used together", name)
	case !c.IsSet("imatrix"):
		if len(include)+len(exclude) > 0 {
			return o, usageErrorf("%s: --include-weights and --exclude-weights filter the --imatrix matrix; none given", name)
		}
		return o, nil
	}
	file := c.String("imatrix")
	m, err := imatrix.Open(file)
	if err != nil {
		return o, err
	}
	if len(exclude) > 0 {
		m = m.Exclude(exclude)
	}
	if len(include) > 0 {
		m = m.Include(include)
	}
	o.Imatrix, o.ImatrixFile = m, file
	return o, nil
}

// quantizeImatrix is the --json record of the importance matrix a
// quantization used.
type quantizeImatrix struct {
	File     string `json:"file"`   // as given (quantize.imatrix.file)
	Format   string `json:"format"` // gguf or dat
	Entries  int    `json:"entries"`
	Chunks   int    `json:"chunks,omitempty"`
	Dataset  string `json:"dataset,omitempty"`
	Weighted int    `json:"weighted_tensors"`
	// Unweighted are the quantized tensors the matrix has no entry for,
	// quantized without one as llama-quantize does.
	Unweighted []string `json:"unweighted_tensors"`
}

// imatrixUse is the matrix record of plan, nil without a matrix.
func imatrixUse(p *quantize.Plan) *quantizeImatrix {
	m := p.Options.Imatrix
	if m == nil || m.Len() == 0 {
		return nil
	}
	u := &quantizeImatrix{File: p.Options.ImatrixFile, Format: m.Format().String(), Entries: m.Len(), Chunks: m.Chunks(),
		Unweighted: append([]string{}, p.Unweighted...)}
	if ds := m.Datasets(); len(ds) > 0 {
		u.Dataset = ds[0]
	}
	for _, t := range p.Tensors {
		if t.Weights != nil {
			u.Weighted++
		}
	}
	return u
}

// overrideLines says, per option that set tensor types (quant.Choice.By),
// how many tensors it set and to which types, naming up to three.
func overrideLines(p *quantize.Plan) []string {
	type group struct {
		names []string
		types []string
	}
	var order []string
	groups := map[string]*group{}
	for _, t := range p.Tensors {
		if t.By == "" {
			continue
		}
		g := groups[t.By]
		if g == nil {
			g = &group{}
			groups[t.By] = g
			order = append(order, t.By)
		}
		g.names = append(g.names, t.Name)
		if ty := t.Type.String(); !slices.Contains(g.types, ty) {
			g.types = append(g.types, ty)
		}
	}
	var lines []string
	for _, by := range order {
		g := groups[by]
		names := strings.Join(g.names[:min(3, len(g.names))], ", ")
		if len(g.names) > 3 {
			names += ", …"
		}
		lines = append(lines, fmt.Sprintf("%s: %d tensors → %s (%s)", by, len(g.names), strings.Join(g.types, ", "), names))
	}
	return lines
}
