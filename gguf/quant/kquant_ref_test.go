package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The reference's group quantizers transliterated one group at a time, in
// the shape of ggml-quants.c, kept as the oracle the lane-parallel forms
// in kquant_lanes.go are checked against (TestLanesMatchScalar).

// makeQKX2 is make_qkx2_quants: the scale and minimum (returned negated,
// as the_min) of an asymmetric nmax-level quantization of x under weights
// w, searching nstep+1 candidate scales around the min-max one. L receives
// the levels; laux is scratch of len(x).
func makeQKX2(x, w []float32, L, laux []uint8, nmax int32, rmin, rdelta float32, nstep int, useMad bool) (scale, theMin float32) {
	n := len(x)
	w = w[:n]
	L = L[:n]
	laux = laux[:n]
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		clear(L)
		return 0, -lo
	}
	fmax := float32(nmax)
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i, v := range x {
		l := uint8(clamp32(nearestInt(float32(iscale*(v-lo))), 0, nmax))
		L[i] = l
		diff := float32(scale*float32(l)) + lo - v
		if useMad {
			diff = abs32(diff)
		} else {
			diff = float32(diff * diff)
		}
		best += float32(w[i] * diff)
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := uint8(clamp32(nearestInt(float32(iscale*(v-lo))), 0, nmax))
			laux[i] = l
			wl := float32(w[i] * float32(l))
			sumL += wl
			sumL2 += float32(wl * float32(l))
			sumXL += float32(wl * v)
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var cur float32
			for i, v := range x {
				diff := float32(thisScale*float32(laux[i])) + thisMin - v
				if useMad {
					diff = abs32(diff)
				} else {
					diff = float32(diff * diff)
				}
				cur += float32(w[i] * diff)
			}
			if cur < best {
				copy(L, laux)
				best = cur
				scale = thisScale
				lo = thisMin
			}
		}
	}
	return scale, -lo
}

// symSums rounds iscale·x to levels l in [-nmax, nmax-1] and returns the
// weighted sums Σ w·x·l and Σ w·l·l with w = x², as make_qx_quants and
// make_q3_quants accumulate them. When L is not nil it receives l+bias.
func symSums(x []float32, L []int8, iscale float32, nmax, bias int32) (sumLX, sumL2 float32) {
	for i, v := range x {
		l := clamp32(nearestInt(float32(iscale*v)), -nmax, nmax-1)
		if L != nil {
			L[i] = int8(l + bias)
		}
		w := float32(v * v)
		fl := float32(l)
		sumLX += float32(float32(w*v) * fl)
		sumL2 += float32(float32(w*fl) * fl)
	}
	return sumLX, sumL2
}

// makeQX is make_qx_quants with rmse_type 1 and no importance weights
// (weights x²): the scale of a symmetric quantization of x into
// [-nmax, nmax-1], trying 18 scales around nmax/max|x|. L receives the
// levels plus nmax.
func makeQX(x []float32, L []int8, nmax int32) float32 {
	L = L[:len(x)]
	xmax, amax := signedMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	sumLX, sumL2 := symSums(x, L, float32(-nmax)/xmax, nmax, nmax)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	fmax := float32(nmax)
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(fmax + float32(0.1*float32(is))) / xmax
		sumLX, sumL2 = symSums(x, nil, iscale, nmax, 0)
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			symSums(x, L, iscale, nmax, nmax)
			scale = sumLX / sumL2
			best = float32(scale * sumLX)
		}
	}
	return scale
}

// makeQ3 is make_q3_quants with do_rmse: a symmetric quantization of x into
// [-nmax, nmax-1] (weights x²), refined one level at a time for up to five
// passes. L receives the levels plus nmax.
func makeQ3(x []float32, L []int8, nmax int32) float32 {
	L = L[:len(x)]
	xmax, amax := signedMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	sumLX, sumL2 := symSums(x, L, float32(-nmax)/xmax, nmax, 0)
	for range 5 {
		changed := false
		for i, v := range x {
			w := float32(v * v)
			fli := float32(L[i])
			slx := sumLX - float32(float32(w*v)*fli)
			if slx > 0 {
				sl2 := sumL2 - float32(float32(w*fli)*fli)
				nl := clamp32(nearestInt(float32(v*sl2)/slx), -nmax, nmax-1)
				if nl != int32(L[i]) {
					fnl := float32(nl)
					slx += float32(float32(w*v) * fnl)
					sl2 += float32(float32(w*fnl) * fnl)
					if sl2 > 0 && float32(float32(slx*slx)*sumL2) > float32(float32(sumLX*sumLX)*sl2) {
						L[i] = int8(nl)
						sumLX, sumL2 = slx, sl2
						changed = true
					}
				}
			}
		}
		if !changed {
			break
		}
	}
	for i := range L {
		L[i] += int8(nmax)
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// laneCase fills 8 groups of n values for TestLanesMatchScalar: each lane
// its own kind of data, so that lanes that stop early (all zero, all
// equal) run beside lanes that search, and ties, NaN and Inf come up.
func laneCase(rng *rand.Rand, n int) (g groups) {
	for k := range 8 {
		kind := rng.IntN(10)
		scale := float32(math.Pow(10, rng.Float64()*10-6))
		for i := 0; i < n; i++ {
			var v float32
			switch kind {
			case 0: // all zero
			case 1:
				v = -0.75 * scale // constant
			case 2:
				v = float32(rng.IntN(9) - 4) // integer ties
			case 3:
				v = float32(rng.IntN(17)-8) / 2
			case 4:
				v = float32(rng.NormFloat64()) * 1e-15
			case 5:
				v = -float32(math.Abs(rng.NormFloat64())) * scale
			case 6:
				switch rng.IntN(6) {
				case 0:
					v = float32(math.NaN())
				case 1:
					v = float32(math.Inf(1 - 2*rng.IntN(2)))
				default:
					v = float32(rng.NormFloat64())
				}
			default:
				v = float32(rng.NormFloat64()) * scale
			}
			g[i][k] = v
		}
	}
	return g
}

// sameBits: equal bits, or both NaN (which NaN an operation returns
// depends on operand order, which neither compiler promises; a NaN scale
// makes a block llama-quantize refuses).
func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// TestLanesMatchScalar: the lane-parallel group quantizers give the bits
// of the scalar transliterations, group by group.
func TestLanesMatchScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 14))
	col := func(g *groups, k, n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = g[i][k]
		}
		return x
	}
	for iter := range 300 {
		for _, p := range []*qkx2{&qkx2Q2, &qkx2Q4, &qkx2Q5} {
			x := laneCase(rng, p.n)
			var w groups
			for i := 0; i < p.n; i++ {
				for k := range 8 {
					w[i][k] = abs32(x[i][k])
					if p.n == 32 {
						w[i][k] += 0.01 * float32(k)
					}
				}
			}
			var L [32][8]uint8
			var scale, theMin [8]float32
			p.run(&x, &w, &L, &scale, &theMin)
			nstep := len(p.steps) - 1
			rmin := p.steps[0] - float32(p.nmax)
			for k := range 8 {
				xs, ws := col(&x, k, p.n), col(&w, k, p.n)
				Ls, laux := make([]uint8, p.n), make([]uint8, p.n)
				s, m := makeQKX2(xs, ws, Ls, laux, p.nmax, rmin, 0.1, nstep, p.mad)
				if !sameBits(s, scale[k]) || !sameBits(m, theMin[k]) {
					t.Fatalf("iter %d nmax %d lane %d: scale, min %g %g, scalar %g %g (x %v)", iter, p.nmax, k, scale[k], theMin[k], s, m, xs)
				}
				for i := range Ls {
					if Ls[i] != L[i][k] {
						t.Fatalf("iter %d nmax %d lane %d: L[%d] = %d, scalar %d", iter, p.nmax, k, i, L[i][k], Ls[i])
					}
				}
			}
		}
		for _, tc := range []struct {
			name string
			run  func(*groups, *[32][8]int8, *[8]float32)
			one  func([]float32, []int8, int32) float32
			nmax int32
		}{
			{"qx", func(x *groups, L *[32][8]int8, s *[8]float32) { symGroups(x, L, s, false) }, makeQX, 32},
			{"q3", func(x *groups, L *[32][8]int8, s *[8]float32) { symGroups(x, L, s, true) }, makeQ3, 4},
		} {
			x := laneCase(rng, 16)
			var L [32][8]int8
			var scale [8]float32
			tc.run(&x, &L, &scale)
			for k := range 8 {
				xs := col(&x, k, 16)
				Ls := make([]int8, 16)
				if s := tc.one(xs, Ls, tc.nmax); !sameBits(s, scale[k]) {
					t.Fatalf("iter %d %s lane %d: scale %g, scalar %g (x %v)", iter, tc.name, k, scale[k], s, xs)
				}
				for i := range Ls {
					if Ls[i] != L[i][k] {
						t.Fatalf("iter %d %s lane %d: L[%d] = %d, scalar %d", iter, tc.name, k, i, L[i][k], Ls[i])
					}
				}
			}
		}
	}
}
