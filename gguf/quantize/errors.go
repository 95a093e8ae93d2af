package quantize

import (
	"math"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// TensorError is how far one output tensor is from the values it was made
// from (the input's, as decoded to float32 before quantizing: for a
// checkpoint, the converter's F16 values).
type TensorError struct {
	Name   string
	InType quant.Type
	Type   quant.Type // the type written
	Params int64      // values
	Bytes  int64      // bytes written, without padding
	// SumSq is the sum of the squared errors, MaxAbs the largest absolute
	// error; RMSE is sqrt(SumSq / Params); RelRMSE is the error relative
	// to the source's size, sqrt(SumSq / Σ source²) (0 for a zero source).
	SumSq, RMSE, RelRMSE, MaxAbs float64
	// SourceSumSq is Σ source² of the values quantized (0 for a copy).
	SourceSumSq float64
	// Cosine is the cosine similarity of the tensor and its source, as
	// flat vectors (1 for a copy, and for two zero vectors).
	Cosine float64
	// Copied: written unchanged (zero error).
	Copied bool
	// WeightedRMSE is the error weighted by the importance matrix the
	// tensor was quantized with, sqrt(Σ w·error² / Σ w), w the importance
	// of each value's column (in its expert's vector); Weighted says the
	// tensor had one.
	WeightedRMSE float64
	Weighted     bool
}

// BitsPerWeight is the tensor's bytes × 8 / values.
func (e TensorError) BitsPerWeight() float64 {
	if e.Params == 0 {
		return 0
	}
	return float64(e.Bytes) * 8 / float64(e.Params)
}

// errorSum is one unit's error sums for one output, in float64, over its
// values in order.
type errorSum struct {
	n          int64
	sq, max    float64
	xy, xx, yy float64
	wsq, wsum  float64 // Σ w·error², Σ w, with importance weights
}

// measure decodes enc (rows [r0, r1) of t, in t.Type) into *deq and sets
// s to its errors against src, weighted too when t has importance
// weights.
func (s *errorSum) measure(t *TensorPlan, r0, r1 int64, enc []byte, src []float32, deq *[]float32) error {
	*deq = grow(*deq, int64(len(src)))
	if err := quant.Decode(t.Type, *deq, enc); err != nil {
		return err
	}
	*s = sums(src, *deq)
	if t.Weights == nil {
		return nil
	}
	cols, per := int64(ne0(t.In.Dims)), t.rowsPerMatrix()
	for r := r0; r < r1; r++ {
		m := r / per
		w := t.Weights[m*cols : (m+1)*cols]
		x, y := src[(r-r0)*cols:(r-r0+1)*cols], (*deq)[(r-r0)*cols:(r-r0+1)*cols]
		for c, wc := range w {
			d := float64(y[c]) - float64(x[c])
			s.wsq += float64(wc) * d * d
			s.wsum += float64(wc)
		}
	}
	return nil
}

// sums is the errorSum of y against x (len(y) ≥ len(x)): four lanes of
// running sums (values i, i+4, … in lane i mod 4), added up lane by lane
// at the end, so the result is the same on every run. The lanes make the
// float64 additions independent of each other: one chain of them made
// this loop cost more than the decoding it measures. The lanes of the
// values run in sumLanes (one AVX2 instruction per operation of all four
// lanes where there is AVX2, the same bits).
func sums(x, y []float32) errorSum {
	var acc lanes
	n := len(x)
	y = y[:n]
	m := n &^ 3
	sumLanes(x[:m], y[:m], &acc)
	if m < n {
		// The last values in lanes 0…, padded with zeros, which change
		// no sum (they are never -0) and no maximum.
		var tx, ty [4]float32
		copy(tx[:], x[m:])
		copy(ty[:], y[m:])
		sumLanes(tx[:], ty[:], &acc)
	}
	s := errorSum{n: int64(n)}
	for l := range 4 {
		s.sq += acc.sq[l]
		s.xy += acc.xy[l]
		s.xx += acc.xx[l]
		s.yy += acc.yy[l]
		s.max = max(s.max, acc.max[l])
	}
	return s
}

// lanes are sums' four lanes of running sums (the layout sumsAVX2 reads
// and writes).
type lanes struct {
	sq, xy, xx, yy, max [4]float64
}

// sumLanesGo adds the values of x and y (a multiple of four of them) to
// acc, value i in lane i mod 4.
func sumLanesGo(x, y []float32, acc *lanes) {
	sq, xy, xx, yy, mx := acc.sq, acc.xy, acc.xx, acc.yy, acc.max
	for i := 0; i+4 <= len(x); i += 4 {
		for l := range 4 {
			xf, yf := float64(x[i+l]), float64(y[i+l])
			d := yf - xf
			sq[l] += d * d
			xy[l] += xf * yf
			xx[l] += xf * xf
			yy[l] += yf * yf
			if a := math.Abs(d); a > mx[l] {
				mx[l] = a
			}
		}
	}
	acc.sq, acc.xy, acc.xx, acc.yy, acc.max = sq, xy, xx, yy, mx
}

// errorSums are every unit's sums, for each output: they are added up per
// tensor in unit order once the run is done, so the totals do not depend
// on which worker finished first.
type errorSums struct {
	outs int
	s    []errorSum
}

func newErrorSums(units, outs int) *errorSums {
	return &errorSums{outs: outs, s: make([]errorSum, units*outs)}
}

// unit is unit u's sums, one per output (nil when errors are not
// measured).
func (e *errorSums) unit(u int) []errorSum {
	if e == nil {
		return nil
	}
	return e.s[u*e.outs : (u+1)*e.outs]
}

// tensors adds up output k's sums per tensor of p.
func (e *errorSums) tensors(p *Plan, units []gguf.Unit, k int) []TensorError {
	type acc struct {
		n                  int64
		sq, mx, xy, xx, yy float64
		wsq, wsum          float64
	}
	accs := make([]acc, len(p.Tensors))
	for u, un := range units {
		s := e.s[u*e.outs+k]
		a := &accs[un.T]
		a.n += s.n
		a.sq += s.sq
		a.mx = max(a.mx, s.max)
		a.xy += s.xy
		a.xx += s.xx
		a.yy += s.yy
		a.wsq += s.wsq
		a.wsum += s.wsum
	}
	out := make([]TensorError, len(p.Tensors))
	for i := range p.Tensors {
		t, a := &p.Tensors[i], accs[i]
		te := TensorError{Name: t.Name, InType: t.InType, Type: t.Type, Params: int64(t.In.NumElements()), Bytes: t.Bytes,
			SumSq: a.sq, MaxAbs: a.mx, Copied: t.Copy(), Cosine: 1}
		if te.Params > 0 {
			te.RMSE = math.Sqrt(a.sq / float64(te.Params))
		}
		if te.Weighted = t.Weights != nil && !te.Copied; te.Weighted && a.wsum > 0 {
			te.WeightedRMSE = math.Sqrt(a.wsq / a.wsum)
		}
		te.SourceSumSq = a.xx
		if a.xx > 0 {
			te.RelRMSE = math.Sqrt(a.sq / a.xx)
		}
		if !te.Copied && (a.xx > 0 || a.yy > 0) {
			te.Cosine = 0
			if a.xx > 0 && a.yy > 0 {
				te.Cosine = a.xy / math.Sqrt(a.xx*a.yy)
			}
		}
		out[i] = te
	}
	return out
}
