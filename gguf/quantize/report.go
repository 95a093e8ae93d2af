package quantize

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"text/tabwriter"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// OutputReport is the quality of one output: what RunOptions.Errors
// measured while it was made.
type OutputReport struct {
	Path     string
	FileType quant.FileType
	Size     int64         // the file's bytes
	Tensors  []TensorError // in plan order
}

// NewOutputReport is out's report from its run's result (run with
// RunOptions.Errors).
func NewOutputReport(out Output, res *RunResult) (OutputReport, error) {
	if len(res.Errors) != len(out.Plan.Tensors) {
		return OutputReport{}, fmt.Errorf("%s: internal error: errors of %d tensors, the plan has %d", out.Path, len(res.Errors), len(out.Plan.Tensors))
	}
	return OutputReport{Path: out.Path, FileType: out.Plan.FileType, Size: out.Plan.Layout.OutputSize(), Tensors: res.Errors}, nil
}

// Summary totals an output's tensors.
type Summary struct {
	Params int64 // values, every tensor
	Bytes  int64 // tensor bytes, without padding
	// BitsPerWeight is Bytes × 8 / Params.
	BitsPerWeight float64
	// RMSE and RelRMSE are over the values of the quantized tensors
	// (the copied ones have none); MaxAbs is the largest absolute error.
	RMSE, RelRMSE, MaxAbs float64
	Quantized             int // tensors
}

// Summary totals r's tensors.
func (r *OutputReport) Summary() Summary {
	var s Summary
	var sq, xx float64
	var n int64
	for _, t := range r.Tensors {
		s.Params += t.Params
		s.Bytes += t.Bytes
		if t.Copied {
			continue
		}
		s.Quantized++
		n += t.Params
		sq += t.SumSq
		xx += t.SourceSumSq
		s.MaxAbs = max(s.MaxAbs, t.MaxAbs)
	}
	if s.Params > 0 {
		s.BitsPerWeight = float64(s.Bytes) * 8 / float64(s.Params)
	}
	if n > 0 {
		s.RMSE = math.Sqrt(sq / float64(n))
	}
	if xx > 0 {
		s.RelRMSE = math.Sqrt(sq / xx)
	}
	return s
}

// Worst is r's n quantized tensors of the largest relative error, worst
// first (ties by name).
func (r *OutputReport) Worst(n int) []TensorError {
	var q []TensorError
	for _, t := range r.Tensors {
		if !t.Copied {
			q = append(q, t)
		}
	}
	slices.SortStableFunc(q, func(a, b TensorError) int {
		if c := cmp.Compare(b.RelRMSE, a.RelRMSE); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	return q[:min(n, len(q))]
}

// Layers is r's relative error per block (blk.N), over the quantized
// tensors of each: sqrt(Σ error² / Σ source²). Blocks without a quantized
// tensor are NaN.
func (r *OutputReport) Layers() []float64 {
	var sq, xx []float64
	for _, t := range r.Tensors {
		b, ok := quant.BlockOf(t.Name)
		if !ok || t.Copied {
			continue
		}
		for len(sq) <= b {
			sq, xx = append(sq, 0), append(xx, 0)
		}
		sq[b] += t.SumSq
		xx[b] += t.SourceSumSq
	}
	out := make([]float64, len(sq))
	for b := range sq {
		out[b] = math.NaN()
		if xx[b] > 0 {
			out[b] = math.Sqrt(sq[b] / xx[b])
		}
	}
	return out
}

// WriteTable writes r's short quality table: size, bits per weight, the
// mean (RMSE) and largest error, and the worst tensors.
func (r *OutputReport) WriteTable(w io.Writer, worst int) error {
	s := r.Summary()
	if _, err := fmt.Fprintf(w, "%s: %s, %d bytes, %.3f bits/weight, %d of %d tensors quantized, RMSE %.3g (%.3f%% of the weights' RMS), max abs error %.3g\n",
		filepath.Base(r.Path), r.FileType, r.Size, s.BitsPerWeight, s.Quantized, len(r.Tensors), s.RMSE, 100*s.RelRMSE, s.MaxAbs); err != nil {
		return err
	}
	ws := r.Worst(worst)
	if len(ws) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  worst tensors\ttype\tbits/weight\trel. RMSE\tRMSE\tmax abs error\tcosine")
	for _, t := range ws {
		fmt.Fprintf(tw, "  %s\t%s\t%.3f\t%.3f%%\t%.3g\t%.3g\t%.6f\n", t.Name, t.Type, t.BitsPerWeight(), 100*t.RelRMSE, t.RMSE, t.MaxAbs, t.Cosine)
	}
	return tw.Flush()
}
