package quantize

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// pqColumn reads column name of every row group of f with parquet-go, a
// reader independent of the writer: strings, int64s, int32s (nulls as -1)
// or float64s (nulls as NaN), by the column's physical type.
func pqColumn(t *testing.T, f *parquet.File, name string) any {
	t.Helper()
	leaf, ok := f.Schema().Lookup(name)
	if !ok {
		t.Fatalf("no column %q", name)
	}
	var strs []string
	var i64s []int64
	var i32s []int32
	var f64s []float64
	kind := leaf.Node.Type().Kind()
	for _, rg := range f.RowGroups() {
		rows := rg.Rows()
		buf := make([]parquet.Row, 64)
		for {
			n, err := rows.ReadRows(buf)
			for _, row := range buf[:n] {
				for _, v := range row {
					if v.Column() != leaf.ColumnIndex {
						continue
					}
					switch kind {
					case parquet.ByteArray:
						strs = append(strs, string(v.ByteArray()))
					case parquet.Int64:
						i64s = append(i64s, v.Int64())
					case parquet.Int32:
						if v.IsNull() {
							i32s = append(i32s, -1)
						} else {
							i32s = append(i32s, v.Int32())
						}
					case parquet.Double:
						if v.IsNull() {
							f64s = append(f64s, math.NaN())
						} else {
							f64s = append(f64s, v.Double())
						}
					default:
						t.Fatalf("%s: physical type %v", name, kind)
					}
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		rows.Close()
	}
	switch kind {
	case parquet.ByteArray:
		return strs
	case parquet.Int64:
		return i64s
	case parquet.Int32:
		return i32s
	}
	return f64s
}

// openParquet opens path with parquet-go for the test's duration.
func openParquet(t *testing.T, path string) *parquet.File {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fh.Close() })
	st, err := fh.Stat()
	if err != nil {
		t.Fatal(err)
	}
	f, err := parquet.OpenFile(fh, st.Size())
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// tensorValues decodes tensor name of the GGUF file path to float32.
func tensorValues(t *testing.T, path, name string) []float32 {
	t.Helper()
	f, ok := openFiles[path]
	if !ok {
		var err error
		if f, err = gguf.Open(path); err != nil {
			t.Fatal(err)
		}
		openFiles[path] = f
		t.Cleanup(func() { f.Close(); delete(openFiles, path) })
	}
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("%s: no tensor %s", path, name)
	}
	raw := make([]byte, ti.Size())
	if _, err := f.Section(ti).ReadAt(raw, 0); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, ti.NumElements())
	switch ti.Type {
	case quant.F32:
		tensor.BytesToF32(out, raw)
	case quant.F16:
		tensor.F16ToF32(out, raw)
	default:
		if err := quant.Decode(ti.Type, out, raw); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// openFiles are the GGUF files tensorValues has open, until the test ends.
var openFiles = map[string]*gguf.File{}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-12+1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// The Parquet report of a three-type run straight from the Qwen3.5
// checkpoint, read back with the parquet package's own column readers:
// one row per output × tensor, and every tensor's errors agree with a
// dequantize-and-compare of the written file against the F16 file
// convert_hf_to_gguf.py made (the values the quantizer read). The SVG
// chart has one line per output with a point per layer.
func TestReportParquet(t *testing.T) {
	dir := t.TempDir()
	types := []string{"Q6_K", "Q4_K_M", "Q2_K"}
	outs, rs := quantizeMulti(t, checkpoints["qwen35"], SourceOptions{}, types, dir, RunOptions{Jobs: 2, ChunkElems: 1 << 12, Errors: true})
	var reports []OutputReport
	for k := range outs {
		r, err := NewOutputReport(outs[k], rs[k])
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, r)
	}
	pq := filepath.Join(dir, "report.parquet")
	if err := WriteReportParquet(pq, reports, "ferry test"); err != nil {
		t.Fatal(err)
	}
	r := openParquet(t, pq)
	rows := 0
	for _, o := range outs {
		rows += len(o.Plan.Tensors)
	}
	if r.NumRows() != int64(rows) {
		t.Fatalf("%d rows, want %d (outputs × tensors)", r.NumRows(), rows)
	}
	output := pqColumn(t, r, "output").([]string)
	otype := pqColumn(t, r, "output_type").([]string)
	name := pqColumn(t, r, "tensor").([]string)
	layer := pqColumn(t, r, "layer").([]int32)
	typ := pqColumn(t, r, "type").([]string)
	params := pqColumn(t, r, "parameters").([]int64)
	nbytes := pqColumn(t, r, "bytes").([]int64)
	bpw := pqColumn(t, r, "bits_per_weight").([]float64)
	rmse := pqColumn(t, r, "rmse").([]float64)
	rel := pqColumn(t, r, "relative_rmse").([]float64)
	maxAbs := pqColumn(t, r, "max_abs_error").([]float64)
	cosine := pqColumn(t, r, "cosine_similarity").([]float64)

	src := input("qwen35") // the F16 file: the values the quantizer read
	srcVals := map[string][]float32{}
	row := 0
	quantized := 0
	for k, o := range outs {
		for _, tp := range o.Plan.Tensors {
			if output[row] != filepath.Base(o.Path) || otype[row] != types[k] || name[row] != tp.Name || typ[row] != tp.Type.String() {
				t.Fatalf("row %d: %s %s %s %s, want %s %s %s %s", row, output[row], otype[row], name[row], typ[row],
					filepath.Base(o.Path), types[k], tp.Name, tp.Type)
			}
			wantLayer := int32(-1)
			if l, ok := quant.BlockOf(tp.Name); ok {
				wantLayer = int32(l)
			}
			if layer[row] != wantLayer {
				t.Errorf("row %d %s: layer %d, want %d", row, tp.Name, layer[row], wantLayer)
			}
			x, ok := srcVals[tp.Name]
			if !ok {
				x = tensorValues(t, src, tp.Name)
				srcVals[tp.Name] = x
			}
			y := tensorValues(t, o.Path, tp.Name)
			var sq, mx, xy, xx, yy float64
			for i := range x {
				d := float64(y[i]) - float64(x[i])
				sq += d * d
				mx = math.Max(mx, math.Abs(d))
				xy += float64(x[i]) * float64(y[i])
				xx += float64(x[i]) * float64(x[i])
				yy += float64(y[i]) * float64(y[i])
			}
			n := float64(len(x))
			wantCos := 1.0
			if !tp.Copy() {
				wantCos = xy / math.Sqrt(xx*yy)
				quantized++
			}
			wantRel := 0.0
			if !tp.Copy() {
				wantRel = math.Sqrt(sq / xx)
			}
			if params[row] != int64(len(x)) || nbytes[row] != tp.Bytes || !near(bpw[row], float64(tp.Bytes)*8/n) {
				t.Errorf("%s %s: %d parameters, %d bytes, %g bits/weight; want %d, %d, %g", types[k], tp.Name, params[row], nbytes[row], bpw[row], len(x), tp.Bytes, float64(tp.Bytes)*8/n)
			}
			for _, c := range []struct {
				what      string
				got, want float64
			}{{"rmse", rmse[row], math.Sqrt(sq / n)}, {"relative_rmse", rel[row], wantRel}, {"max_abs_error", maxAbs[row], mx}, {"cosine_similarity", cosine[row], wantCos}} {
				if !near(c.got, c.want) {
					t.Errorf("%s %s: %s %g, dequantize-and-compare gives %g", types[k], tp.Name, c.what, c.got, c.want)
				}
			}
			if !tp.Copy() && sq == 0 {
				t.Errorf("%s %s: quantized without any error: the comparison proves nothing", types[k], tp.Name)
			}
			row++
		}
	}
	if quantized < 3*20 {
		t.Errorf("only %d quantized tensors compared", quantized)
	}

	svg := filepath.Join(dir, "report.svg")
	if err := WriteReportSVG(svg, reports); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Polylines []struct {
			Points string `xml:"points,attr"`
		} `xml:"polyline"`
		Texts []string `xml:"text"`
	}
	if err := xml.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil {
		t.Fatalf("the SVG does not parse: %v", err)
	}
	if len(doc.Polylines) != len(types) {
		t.Fatalf("%d lines in the chart, want one per output (%d)", len(doc.Polylines), len(types))
	}
	layers := len(reports[0].Layers()) // qwen35: 4 blocks + the MTP block
	for k, pl := range doc.Polylines {
		if n := len(strings.Fields(pl.Points)); n != layers {
			t.Errorf("line %d: %d points, want %d layers", k, n, layers)
		}
	}
	legend := strings.Join(doc.Texts, " ")
	for _, ty := range types {
		if !strings.Contains(legend, ty) {
			t.Errorf("the legend does not name %s", ty)
		}
	}

	// The table names the output, its type and its worst tensor.
	var tb bytes.Buffer
	if err := reports[2].WriteTable(&tb, 3); err != nil {
		t.Fatal(err)
	}
	worst := reports[2].Worst(1)[0]
	for _, want := range []string{"base-Q2_K.gguf", "Q2_K", fmt.Sprint(reports[2].Size), worst.Name} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, tb.String())
		}
	}
}

// With an importance matrix, weighted_rmse is each weighted tensor's
// error weighted by its importance vector, as a dequantize-and-compare of
// the written file computes it, and null for the tensors quantized without
// one (the MTP block: llama-imatrix never runs it).
func TestReportWeighted(t *testing.T) {
	dir := t.TempDir()
	m := openMatrix(t, matrixPath("qwen35", ".gguf"))
	f, p, err := plan(t, input("qwen35"), Options{FileType: quant.FileQ4_K_M, Imatrix: m, ImatrixFile: "imatrix.gguf"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "w.gguf")
	rr, err := Run(context.Background(), f, p, out, RunOptions{Jobs: 2, ChunkElems: 1 << 12, Errors: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewOutputReport(Output{Plan: p, Path: out}, rr)
	if err != nil {
		t.Fatal(err)
	}
	pq := filepath.Join(dir, "w.parquet")
	if err := WriteReportParquet(pq, []OutputReport{r}, "ferry test"); err != nil {
		t.Fatal(err)
	}
	pf := openParquet(t, pq)
	wrmse := pqColumn(t, pf, "weighted_rmse").([]float64)
	weighted, unweighted := 0, 0
	for i, tp := range p.Tensors {
		if tp.Weights == nil || tp.Copy() {
			if !math.IsNaN(wrmse[i]) {
				t.Errorf("%s: weighted_rmse %g, want null (no importance vector)", tp.Name, wrmse[i])
			}
			if !tp.Copy() {
				unweighted++
			}
			continue
		}
		weighted++
		x, y := tensorValues(t, input("qwen35"), tp.Name), tensorValues(t, out, tp.Name)
		cols, per := int(tp.In.Dims[0]), int(tp.rowsPerMatrix())
		var wsq, ws float64
		for i := range x {
			row, c := i/cols, i%cols
			w := float64(tp.Weights[(row/per)*cols+c])
			d := float64(y[i]) - float64(x[i])
			wsq += w * d * d
			ws += w
		}
		if want := math.Sqrt(wsq / ws); !near(wrmse[i], want) {
			t.Errorf("%s: weighted_rmse %g, dequantize-and-compare gives %g", tp.Name, wrmse[i], want)
		}
	}
	if weighted < 20 || unweighted == 0 {
		t.Errorf("%d weighted and %d unweighted quantized tensors: the test proves little", weighted, unweighted)
	}
}
