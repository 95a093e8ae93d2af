package quant

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestKernelsMatch: the kernels in use (AVX2 on an amd64 CPU that has it)
// give the bits of their portable forms, and so do whole encodings. Where
// there is no AVX2 both sides are the portable forms.
func TestKernelsMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	row := func(f func(k int) float32) (r [8]float32) {
		for k := range r {
			r[k] = f(k)
		}
		return r
	}
	sameRow := func(what string, a, b []float32) {
		t.Helper()
		for k := range a {
			if !sameBits(a[k], b[k]) {
				t.Fatalf("%s lane %d: %g, portable %g", what, k, a[k], b[k])
			}
		}
	}
	for iter := range 500 {
		n := 16 + 16*(iter%2)
		x := laneCase(rng, n)
		var w, wx groups
		lo8 := row(func(int) float32 { return -float32(rng.Float64()) })
		for i := range n {
			for k := range 8 {
				v := x[i][k]
				w[i][k] = abs32(v) + float32(rng.Float64())
				wx[i][k] = float32(w[i][k] * v)
			}
		}
		iscale := row(func(int) float32 { return float32(rng.NormFloat64() * math.Pow(10, rng.Float64()*8-4)) })
		nmax := int32(1 + rng.IntN(40))
		var la, lb [32][8]int32
		var sa, sb [3][8]float32
		levels(&x, &w, &lo8, &iscale, nmax, n, &la, &sa) // the selected form
		levelsGo(&x, &w, &lo8, &iscale, nmax, n, &lb, &sb)
		if la != lb {
			t.Fatalf("iter %d: levels differ:\n%v\n%v", iter, la, lb)
		}
		for j := range sa {
			sameRow("levels sum", sa[j][:], sb[j][:])
		}
		ts := row(func(int) float32 { return float32(rng.NormFloat64()) })
		tm := row(func(int) float32 { return -float32(rng.Float64()) })
		for _, mad := range []bool{false, true} {
			var ca, cb [8]float32
			errs(&x, &w, &la, &ts, &tm, mad, n, &ca)
			errsGo(&x, &w, &la, &ts, &tm, mad, n, &cb)
			sameRow("errs", ca[:], cb[:])
		}
		// The whole candidate loop of make_qkx2_quants from a state
		// made as run makes it, with some lanes' sums degenerate.
		for _, p := range []*qkx2{&qkx2Q2, &qkx2Q4, &qkx2Q5} {
			if p.n > n {
				continue
			}
			var ia, ib qkx2Lanes
			qkx2Init(&x, &w, p.n, &ia)
			qkx2InitGo(&x, &w, p.n, &ib)
			for _, f := range []struct {
				what string
				a, b *[8]float32
			}{{"lo", &ia.lo, &ib.lo}, {"hi", &ia.hi, &ib.hi}, {"sumW", &ia.sumW, &ib.sumW}, {"sumX", &ia.sumX, &ib.sumX}} {
				sameRow(fmt.Sprintf("iter %d, n %d: first pass's %s", iter, p.n, f.what), f.a[:], f.b[:])
			}
			var st qkx2Lanes
			for k := range 8 {
				lo, hi := x[0][k], x[0][k]
				for i := range p.n {
					lo, hi = min(lo, x[i][k]), max(hi, x[i][k])
					st.sumW[k] += w[i][k]
					st.sumX[k] += float32(w[i][k] * x[i][k])
				}
				st.hi[k], st.lo[k] = hi, min(lo, 0)
				st.rng[k] = st.hi[k] - st.lo[k]
				st.best[k] = float32(rng.Float64()) * st.sumW[k]
				st.scale[k] = st.rng[k] / float32(p.nmax)
				st.useIscale[k], st.useMin[k] = 1/st.scale[k], st.lo[k]
			}
			if iter%7 == 0 {
				st.sumW[iter%8] = 0 // D ≤ 0 on that lane
			}
			a, b := st, st
			var l1, l2 [32][8]int32
			qkx2Steps(&a, &x, &w, p.steps, p.nmax, p.n, p.mad, &l1)
			qkx2StepsGo(&b, &x, &w, p.steps, p.nmax, p.n, p.mad, &l2)
			for _, f := range []struct {
				what string
				a, b *[8]float32
			}{{"lo", &a.lo, &b.lo}, {"rng", &a.rng, &b.rng}, {"best", &a.best, &b.best}, {"scale", &a.scale, &b.scale},
				{"useIscale", &a.useIscale, &b.useIscale}, {"useMin", &a.useMin, &b.useMin}} {
				sameRow(fmt.Sprintf("iter %d, nmax %d: steps' %s", iter, p.nmax, f.what), f.a[:], f.b[:])
			}
			// laux is scratch, left with the last step's levels. Where a
			// lane's range is NaN they depend on which NaN's payload an
			// operation keeps, which the Go compiler may pick by swapping
			// a product's operands: only the other lanes are compared.
			for k := range 8 {
				if b.rng[k] != b.rng[k] {
					continue
				}
				for i := range p.n {
					if l1[i][k] != l2[i][k] {
						t.Fatalf("iter %d, nmax %d: the steps' last levels differ in lane %d, row %d: %d, portable %d", iter, p.nmax, k, i, l1[i][k], l2[i][k])
					}
				}
			}
		}
		// make_qx_quants' 18 other scales, from its first pass's state.
		if n == 16 {
			var xm, am [8]float32
			signedMaxesGo(&x, n, &xm, &am)
			var xw, xwx groups
			for i := range n {
				for k := range 8 {
					xw[i][k] = float32(x[i][k] * x[i][k])
					xwx[i][k] = float32(xw[i][k] * x[i][k])
				}
			}
			st := qxLanes{xmax: xm}
			var first [32][8]int32
			var fs [2][8]float32
			for k := range 8 {
				st.useIscale[k] = -32 / xm[k]
			}
			symLevelsGo(&x, &xw, &xwx, &st.useIscale, -32, 31, n, &first, &fs)
			for k := range 8 {
				if fs[1][k] != 0 {
					st.scale[k] = fs[0][k] / fs[1][k]
				}
				st.best[k] = float32(st.scale[k] * fs[0][k])
			}
			a, b := st, st
			qxSteps(&a, &x, &xw, &xwx)
			qxStepsGo(&b, &x, &xw, &xwx)
			for _, f := range []struct {
				what string
				a, b *[8]float32
			}{{"scale", &a.scale, &b.scale}, {"best", &a.best, &b.best}, {"useIscale", &a.useIscale, &b.useIscale}} {
				sameRow(fmt.Sprintf("iter %d: make_qx_quants steps' %s", iter, f.what), f.a[:], f.b[:])
			}
		}
		// The transposing load and the last levels pass, on the same
		// values laid out as a block holds them.
		flat := make([]float32, 8*n)
		for i := range n {
			for k := range 8 {
				flat[n*k+i] = x[i][k]
			}
		}
		var ga, gb groups
		ga.load(flat, n)
		gb.loadGo(flat, n)
		for i := range 32 {
			sameRow(fmt.Sprintf("iter %d: load of %d values, row %d", iter, n, i), ga[i][:], gb[i][:])
		}
		for _, d := range []float32{float32(rng.NormFloat64()), float32(rng.Float64() * 1e-3), 0, float32(math.Inf(1)), -float32(rng.Float64())} {
			for _, c := range []struct {
				doAdd        bool
				lo, hi, bias int32
			}{{true, 0, nmax, 0}, {false, -32, 31, 32}, {true, -4, 3, 4}} {
				add := -float32(rng.Float64())
				oa, ob := make([]byte, len(flat)), make([]byte, len(flat))
				divLevels(flat, add, d, c.doAdd, c.lo, c.hi, c.bias, oa)
				divLevelsGo(flat, add, d, c.doAdd, c.lo, c.hi, c.bias, ob)
				if !bytes.Equal(oa, ob) {
					t.Fatalf("iter %d: levels over d=%g (add %v %g, [%d, %d] + %d) differ:\n%v\n%v", iter, d, c.doAdd, add, c.lo, c.hi, c.bias, oa, ob)
				}
			}
		}
		if n == 32 {
			var wa, wb groups
			k45Weights(&x, &wa)
			k45WeightsGo(&x, &wb)
			for i := range 32 {
				sameRow(fmt.Sprintf("iter %d: K4/K5 weights row %d", iter, i), wa[i][:], wb[i][:])
			}
		}
		var ma, mb, aa, ab [8]float32
		signedMaxes(&x, n, &ma, &aa)
		signedMaxesGo(&x, n, &mb, &ab)
		sameRow("signed max", ma[:], mb[:])
		sameRow("max magnitude", aa[:], ab[:])
		var qa, qb [2][8]float32
		lo := -nmax
		symLevels(&x, &w, &wx, &iscale, lo, nmax-1, n, &la, &qa)
		symLevelsGo(&x, &w, &wx, &iscale, lo, nmax-1, n, &lb, &qb)
		if la != lb {
			t.Fatalf("iter %d: symmetric levels differ", iter)
		}
		for j := range qa {
			sameRow("symLevels sum", qa[j][:], qb[j][:])
		}
	}

	// Whole blocks: every K type over the same rows, kernels as selected
	// and portable.
	src := make([]float32, 64*QK_K)
	for b := 0; b < 64; b++ {
		g := laneCase(rng, 32)
		for i := range QK_K {
			src[b*QK_K+i] = g[i%32][(i/32)%8] * float32(1+i/32)
		}
	}
	for _, ty := range []Type{Q2_K, Q3_K, Q4_K, Q5_K, Q6_K} {
		enc := ty.row().Encode
		a := make([]byte, 64*ty.TypeSize())
		b := make([]byte, len(a))
		enc(a, src)
		saved := useAVX2
		useAVX2 = false
		enc(b, src)
		useAVX2 = saved
		if !bytes.Equal(a, b) {
			t.Errorf("%s: encodings with the selected and the portable kernels differ", ty)
		}
	}
}
