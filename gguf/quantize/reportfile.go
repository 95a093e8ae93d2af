package quantize

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/parquetfile"
)

// WriteReportParquet writes the reports to path (atomically), one row per
// output × tensor, output by output, tensors in plan order; createdBy
// names the writing program. Columns: output (the output's file name),
// output_type (its llama-quantize type, Q4_K_M), tensor, layer (int32,
// null for a tensor outside the blocks), type (ggml type written),
// input_type (ggml type read), parameters, bytes, bits_per_weight, rmse,
// relative_rmse, max_abs_error, cosine_similarity (the errors of a copied
// tensor are 0, cosine 1), weighted_rmse (TensorError.WeightedRMSE; null
// for a tensor quantized without an importance vector).
func WriteReportParquet(path string, reports []OutputReport, createdBy string) error {
	cols := []parquetfile.Column{
		{Name: "output", Kind: parquetfile.String},
		{Name: "output_type", Kind: parquetfile.String},
		{Name: "tensor", Kind: parquetfile.String},
		{Name: "layer", Kind: parquetfile.Int32, Nullable: true},
		{Name: "type", Kind: parquetfile.String},
		{Name: "input_type", Kind: parquetfile.String},
		{Name: "parameters", Kind: parquetfile.Int64},
		{Name: "bytes", Kind: parquetfile.Int64},
		{Name: "bits_per_weight", Kind: parquetfile.Float64},
		{Name: "rmse", Kind: parquetfile.Float64},
		{Name: "relative_rmse", Kind: parquetfile.Float64},
		{Name: "max_abs_error", Kind: parquetfile.Float64},
		{Name: "cosine_similarity", Kind: parquetfile.Float64},
		{Name: "weighted_rmse", Kind: parquetfile.Float64, Nullable: true},
	}
	str := func(i int, v string) { cols[i].Strings = append(cols[i].Strings, v) }
	i64 := func(i int, v int64) { cols[i].Int64s = append(cols[i].Int64s, v) }
	f64 := func(i int, v float64) { cols[i].Float64s = append(cols[i].Float64s, v) }
	rows := 0
	for _, r := range reports {
		for _, t := range r.Tensors {
			rows++
			str(0, filepath.Base(r.Path))
			str(1, r.FileType.String())
			str(2, t.Name)
			l, ok := quant.BlockOf(t.Name)
			cols[3].Int32s = append(cols[3].Int32s, int32(l))
			cols[3].Null = append(cols[3].Null, !ok)
			str(4, t.Type.String())
			str(5, t.InType.String())
			i64(6, t.Params)
			i64(7, t.Bytes)
			f64(8, t.BitsPerWeight())
			f64(9, t.RMSE)
			f64(10, t.RelRMSE)
			f64(11, t.MaxAbs)
			f64(12, t.Cosine)
			f64(13, t.WeightedRMSE)
			cols[13].Null = append(cols[13].Null, !t.Weighted)
		}
	}
	if rows == 0 {
		cols[3].Null, cols[13].Null = nil, nil
	}
	return parquetfile.Write(path, rows, cols, createdBy)
}

// svgColors are the lines' colours, one per output (cycled).
var svgColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// WriteReportSVG writes a chart of the relative error per layer
// (OutputReport.Layers, in percent), one line per output, to path
// (atomically).
func WriteReportSVG(path string, reports []OutputReport) error {
	const W, H, left, right, top, bottom = 760.0, 420.0, 70.0, 170.0, 40.0, 50.0
	layers := make([][]float64, len(reports))
	n, ymax := 0, 0.0
	for k := range reports {
		layers[k] = reports[k].Layers()
		n = max(n, len(layers[k]))
		for _, v := range layers[k] {
			if !math.IsNaN(v) {
				ymax = max(ymax, 100*v)
			}
		}
	}
	if ymax <= 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	pw, ph := W-left-right, H-top-bottom
	x := func(l int) float64 {
		if n <= 1 {
			return left + pw/2
		}
		return left + pw*float64(l)/float64(n-1)
	}
	y := func(v float64) float64 { return top + ph*(1-v/ymax) }
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%g" height="%g" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15">Quantization error per layer (RMSE relative to the weights' RMS)</text>`+"\n", left)
	for i := 0; i <= 4; i++ { // y grid
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%s%%</text>`+"\n",
			left, y(v), left+pw, y(v), left-6, y(v)+4, trimFloat(v))
	}
	step := max(1, n/20)
	for l := 0; l < n; l += step { // x ticks
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%d</text>`+"\n", x(l), top+ph+18, l)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">layer (blk.N)</text>`+"\n", left+pw/2, H-8)
	fmt.Fprintf(&b, `<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>`+"\n", left, top, pw, ph)
	for k, r := range reports {
		color := svgColors[k%len(svgColors)]
		var pts []string
		for l, v := range layers[k] {
			if math.IsNaN(v) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(l), y(100*v)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"><title>%s layer %d: %.4f%%</title></circle>`+"\n",
				x(l), y(100*v), color, html.EscapeString(r.FileType.String()), l, 100*v)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		}
		ly := top + 10 + 20*float64(k)
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="3"/><text x="%g" y="%g">%s</text>`+"\n",
			left+pw+15, ly, left+pw+40, ly, color, left+pw+46, ly+4, html.EscapeString(r.FileType.String()))
	}
	b.WriteString("</svg>\n")
	return fsutil.WriteFileAtomic(path, b.Bytes(), fsutil.DefaultPerm)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string { return fmt.Sprintf("%.3g", v) }
