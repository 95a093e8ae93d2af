package quantize

import (
	"math"
	"math/rand/v2"
	"testing"
)

// sumsRef is sums written plainly: value i in lane i mod 4, the lanes
// added up at the end.
func sumsRef(x, y []float32) errorSum {
	var sq, xy, xx, yy, mx [4]float64
	for i := range x {
		l := i % 4
		xf, yf := float64(x[i]), float64(y[i])
		d := yf - xf
		sq[l] += d * d
		xy[l] += xf * yf
		xx[l] += xf * xf
		yy[l] += yf * yf
		if a := math.Abs(d); a > mx[l] {
			mx[l] = a
		}
	}
	s := errorSum{n: int64(len(x))}
	for l := range 4 {
		s.sq += sq[l]
		s.xy += xy[l]
		s.xx += xx[l]
		s.yy += yy[l]
		s.max = max(s.max, mx[l])
	}
	return s
}

// sums gives sumsRef's bits with and without the AVX2 lanes, on values
// that include NaN, ±Inf, ±0, subnormals and huge ones, at lengths that
// leave every tail (padded with zeros).
func TestSumsAVX2MatchesGo(t *testing.T) {
	avx := useAVX2
	defer func() { useAVX2 = avx }()
	r := rand.New(rand.NewPCG(7, 8))
	special := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1)), 1e-45, 3e38, -3e38}
	val := func() float32 {
		if r.IntN(16) == 0 {
			return special[r.IntN(len(special))]
		}
		return float32(r.NormFloat64())
	}
	// The bits, every NaN as one (x86 gives NaNs of other signs and
	// payloads to the scalar and the vector forms; a NaN is a NaN here).
	f := func(v float64) uint64 {
		if math.IsNaN(v) {
			return 0x7ff8000000000000
		}
		return math.Float64bits(v)
	}
	bits := func(s errorSum) [6]uint64 {
		return [6]uint64{f(s.sq), f(s.xy), f(s.xx), f(s.yy), f(s.max), uint64(s.n)}
	}
	for _, n := range []int{0, 1, 3, 4, 5, 7, 8, 64, 1001, 4096} {
		for trial := range 20 {
			x, y := make([]float32, n), make([]float32, n+r.IntN(3))
			for i := range x {
				x[i] = val()
				// Mostly close, as a quantization error is.
				y[i] = x[i] + float32(r.NormFloat64()*0.01)
				if r.IntN(32) == 0 {
					y[i] = val()
				}
			}
			want := sumsRef(x, y)
			for _, v := range []bool{false, avx} {
				useAVX2 = v
				if got := sums(x, y); bits(got) != bits(want) {
					t.Fatalf("n %d, trial %d, AVX2 %v: %+v, want %+v", n, trial, v, got, want)
				}
			}
		}
	}
}

func BenchmarkSums(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x, y := make([]float32, 1<<16), make([]float32, 1<<16)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		y[i] = x[i] + float32(r.NormFloat64()*0.01)
	}
	for _, avx := range []bool{false, true} {
		if avx && !useAVX2 {
			continue
		}
		name := "go"
		if avx {
			name = "avx2"
		}
		b.Run(name, func(b *testing.B) {
			old := useAVX2
			useAVX2 = avx
			defer func() { useAVX2 = old }()
			b.SetBytes(int64(len(x)) * 8)
			for range b.N {
				sums(x, y)
			}
		})
	}
}
