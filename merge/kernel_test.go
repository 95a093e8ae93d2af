package merge

import (
	"math"
	"path/filepath"
	"testing"
)

// TestFMA32 checks the emulated float32 FMA against float64 exact cases and
// against the halfway cases that a plain float64 sum would double-round.
func TestFMA32(t *testing.T) {
	cases := []struct{ a, b, c float32 }{
		{1, 1, 0},
		{0.1, 0.2, 0.3},
		// a·b = 1 + 2⁻²⁴ + 2⁻⁴⁸-ish products landing near float32 halfway points
		{1 + 1.0/(1<<12), 1 + 1.0/(1<<12), 0},
		{1 + 1.0/(1<<23), 1 + 1.0/(1<<23), -1},
		{3, 1.0 / 3, -1},
		{1e-20, 1e-20, 0}, // float32 subnormal result
		{-2, 0.5, 1},
	}
	var r rng = 7
	for i := 0; i < 200000; i++ {
		cases = append(cases, struct{ a, b, c float32 }{r.uniform(1), r.uniform(1), r.uniform(1)})
		// halfway-prone: c large, product tiny
		cases = append(cases, struct{ a, b, c float32 }{r.uniform(1) * 1e-8, r.uniform(1), 1 + r.uniform(1)})
	}
	for _, c := range cases {
		got := fma32(c.a, c.b, c.c)
		want := exactFMA32(c.a, c.b, c.c)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g, want %g", c.a, c.b, c.c, got, want)
		}
	}
}

// exactFMA32 rounds a·b+c once to float32 using big-enough integer math
// on the scaled exact value (independent of fma32's round-to-odd trick).
func exactFMA32(a, b, c float32) float32 {
	p := float64(a) * float64(b) // exact
	// Split the exact sum p+c into hi (float64) + lo (exact remainder).
	hi := p + float64(c)
	bb := hi - p
	lo := (p - (hi - bb)) + (float64(c) - bb)
	f := float32(hi)
	// Correct f if hi+lo is closer to a neighbour of f.
	for _, g := range []float32{math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, float32(math.Inf(-1)))} {
		dg := math.Abs((float64(g) - hi) - lo)
		df := math.Abs((float64(f) - hi) - lo)
		if dg < df || (dg == df && math.Float32bits(g)&1 == 0) {
			f = g
		}
	}
	return f
}

// TestLowRankAsmMatchesGo: the assembly tiles and the pure-Go kernel give
// the same bits, tails included.
func TestLowRankAsmMatchesGo(t *testing.T) {
	for _, sz := range []struct{ n, r, cols int }{{1, 1, 16}, {4, 8, 64}, {7, 16, 100}, {9, 3, 33}, {5, 16, 5120}, {3, 2, 7}} {
		L := gen(1, "L", "F32", 0.5, int64(sz.n), int64(sz.r)).vals
		R := gen(2, "R", "F32", 0.5, int64(sz.r), int64(sz.cols)).vals
		a := make([]float32, sz.n*sz.cols)
		b := make([]float32, sz.n*sz.cols)
		lowRank(a, L, R, sz.n, sz.r, sz.cols)
		forceGo = true
		lowRank(b, L, R, sz.n, sz.r, sz.cols)
		forceGo = false
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%+v: element %d: fast %g, Go %g", sz, i, a[i], b[i])
			}
			// and the chain is what fma32 computes
			row, col := i/sz.cols, i%sz.cols
			var d float32
			for k := 0; k < sz.r; k++ {
				d = fma32(L[row*sz.r+k], R[k*sz.cols+col], d)
			}
			if d != a[i] {
				t.Fatalf("%+v: element %d: %g, fma chain %g", sz, i, a[i], d)
			}
		}
	}
}

// TestGoldenPureGo runs a golden merge with the pure-Go kernel only (what
// arm64 Macs run).
func TestGoldenPureGo(t *testing.T) {
	forceGo = true
	defer func() { forceGo = false }()
	gc := goldenCases[0]
	out := filepath.Join(t.TempDir(), "merged")
	_, got := runMerge(t, gc.base, gc.adapter, out, PlanOptions{}, 2)
	forceGo = false
	_, want := runMerge(t, gc.base, gc.adapter, filepath.Join(t.TempDir(), "m2"), PlanOptions{}, 2)
	for i := range want.Files {
		if got.Files[i] != want.Files[i] {
			t.Errorf("%s differs between the pure-Go and the assembly kernel", want.Files[i].Name)
		}
	}
}
