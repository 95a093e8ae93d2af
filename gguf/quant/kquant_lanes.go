package quant

// Lane-parallel forms of the reference's group quantizers. Groups (the 16-
// or 32-value sub-blocks of a super-block) are independent in the
// reference: each make_*_quants call sees only its own values. So eight
// groups run at once here, one per lane, each lane doing exactly the
// scalar operations of its group in the same order (every sum still
// sequential in index order). Eight independent dependency chains keep the
// CPU busy where one group's chain of additions would stall it; the bits
// are the reference's. Data is transposed: x[i][k] is value i of lane k.

// groups holds up to 32 values of each of 8 groups, transposed.
type groups [32][8]float32

// qkx2 is make_qkx2_quants' parameters for one block type.
type qkx2 struct {
	n     int
	nmax  int32
	steps []float32 // rmin + rdelta·is + nmax for is = 0…nstep, in float32 as the reference computes it
	mad   bool      // use_mad: absolute instead of squared error
}

func newQKX2(n int, nmax int32, rmin, rdelta float32, nstep int, mad bool) qkx2 {
	p := qkx2{n: n, nmax: nmax, mad: mad}
	for is := 0; is <= nstep; is++ {
		p.steps = append(p.steps, rmin+float32(rdelta*float32(is))+float32(nmax))
	}
	return p
}

var (
	qkx2Q2 = newQKX2(16, 3, -0.5, 0.1, 15, true)
	qkx2Q4 = newQKX2(32, 15, -1, 0.1, 20, false)
	qkx2Q5 = newQKX2(32, 31, -0.5, 0.1, 15, false)
)

// run is make_qkx2_quants on eight groups of p.n values with weights w:
// L receives the levels, scale and theMin each group's results.
func (p *qkx2) run(x, w *groups, L *[32][8]uint8, scale, theMin *[8]float32) {
	n, nmax := p.n, p.nmax
	fmax := float32(nmax)
	var st qkx2Lanes
	qkx2Init(x, w, n, &st)
	var iscale [8]float32
	for k := range 8 {
		if st.lo[k] > 0 {
			st.lo[k] = 0
		}
		st.rng[k] = st.hi[k] - st.lo[k]
		iscale[k] = fmax / st.rng[k]
		st.scale[k] = 1 / iscale[k]
	}
	lo0 := st.lo
	// The first candidate: its error is the one to beat. A group's levels
	// are those of the candidate it takes last, a function of that pass's
	// iscale and min alone: they are recomputed once at the end from
	// (useIscale, useMin) rather than copied at every take.
	var laux [32][8]int32
	var sums [3][8]float32
	levels(x, w, &st.lo, &iscale, nmax, n, &laux, &sums)
	errs(x, w, &laux, &st.scale, &st.lo, p.mad, n, &st.best)
	st.useIscale, st.useMin = iscale, st.lo
	qkx2Steps(&st, x, w, p.steps, nmax, n, p.mad, &laux)
	levels(x, w, &st.useMin, &st.useIscale, nmax, n, &laux, &sums)
	for i := 0; i < n; i++ {
		for k := range 8 {
			L[i][k] = uint8(laux[i][k])
		}
	}
	hi, lo := &st.hi, &st.lo
	*scale = st.scale
	for k := range 8 {
		if hi[k] == lo0[k] { // all equal: no levels
			scale[k] = 0
			lo[k] = lo0[k]
			for i := 0; i < n; i++ {
				L[i][k] = 0
			}
		}
		theMin[k] = -lo[k]
	}
}

// qkx2Lanes is the state of make_qkx2_quants on eight groups between
// candidates: the fixed sums, the max and the current min and range, and
// the best candidate so far (its error, scale and min, and the iscale and
// min its levels come from). qkx2StepsAVX2 reads it at the offsets of
// this field order.
type qkx2Lanes struct {
	sumW, sumX, hi, lo, rng, best, scale, useIscale, useMin [8]float32
}

// qkx2InitGo is the first pass of make_qkx2_quants on eight groups of
// n ≥ 1 values: min and max, Σ w and Σ w·x in index order, into s's lo
// (not yet clamped to 0), hi, sumW and sumX.
func qkx2InitGo(x, w *groups, n int, s *qkx2Lanes) {
	lo, hi, sumW := x[0], x[0], w[0]
	var sumX [8]float32
	for k := range 8 {
		sumX[k] = float32(w[0][k] * x[0][k])
	}
	for i := 1; i < n; i++ {
		xi, wi := &x[i], &w[i]
		for k := range 8 {
			v := xi[k]
			if v < lo[k] {
				lo[k] = v
			}
			if v > hi[k] {
				hi[k] = v
			}
			sumW[k] += wi[k]
			sumX[k] += float32(wi[k] * v)
		}
	}
	s.lo, s.hi, s.sumW, s.sumX = lo, hi, sumW, sumX
}

// qkx2StepsGo is the candidate loop of make_qkx2_quants on eight groups:
// for each step's numerator, iscale = num / range, the levels and their
// sums, the least-squares scale and min (the min clamped to 0 as the
// reference does), their error, and the candidate taken where it beats
// the best. laux is scratch.
func qkx2StepsGo(s *qkx2Lanes, x, w *groups, steps []float32, nmax int32, n int, mad bool, laux *[32][8]int32) {
	for _, num := range steps {
		var iscale [8]float32
		for k := range 8 {
			iscale[k] = num / s.rng[k]
		}
		var sums [3][8]float32
		levelsGo(x, w, &s.lo, &iscale, nmax, n, laux, &sums)
		sumL, sumL2, sumXL := &sums[0], &sums[1], &sums[2]
		var ts, tm [8]float32
		var ok [8]bool
		some := false
		for k := range 8 {
			D := float32(s.sumW[k]*sumL2[k]) - float32(sumL[k]*sumL[k])
			if D > 0 {
				ts[k] = (float32(s.sumW[k]*sumXL[k]) - float32(s.sumX[k]*sumL[k])) / D
				tm[k] = (float32(sumL2[k]*s.sumX[k]) - float32(sumL[k]*sumXL[k])) / D
				if tm[k] > 0 {
					tm[k] = 0
					ts[k] = sumXL[k] / sumL2[k]
				}
				ok[k], some = true, true
			}
		}
		if !some {
			continue
		}
		var cur [8]float32
		errsGo(x, w, laux, &ts, &tm, mad, n, &cur)
		for k := range 8 {
			if ok[k] && cur[k] < s.best[k] {
				s.useIscale[k], s.useMin[k] = iscale[k], s.lo[k]
				s.best[k], s.scale[k], s.lo[k] = cur[k], ts[k], tm[k]
				s.rng[k] = s.hi[k] - s.lo[k]
			}
		}
	}
}

// qxNum is -(nmax + 0.1·is) for Q6_K's is = -9…9 but 0, as
// make_qx_quants computes it.
var qxNum = func() (t [18]float32) {
	i := 0
	for is := int32(-9); is <= 9; is++ {
		if is != 0 {
			t[i] = -(32 + float32(0.1*float32(is)))
			i++
		}
	}
	return t
}()

// symGroups is, on eight groups of 16, make_qx_quants(nmax 32,
// rmse_type 1, no weights) for Q6_K, or with q3 make_q3_quants(nmax 4,
// do_rmse) for Q3_K. Both start from the same pass at iscale = -nmax/max
// with weights x²; make_qx_quants then tries 18 other scales, make_q3_quants
// moves single levels. L receives the levels plus nmax, scale each group's
// scale.
func symGroups(x *groups, L *[32][8]int8, scale *[8]float32, q3 bool) {
	var lv [32][8]int32
	var amax [8]float32
	symSearch(x, &lv, &amax, scale, q3)
	nmax := int32(32)
	if q3 {
		nmax = 4
	}
	for k := range 8 {
		symLevelsOf(&lv, &amax, k, nmax, func(i int, l int8) { L[i][k] = l })
	}
}

// symLevelsOf hands the 16 levels of group k (symSearch's lv plus nmax,
// zeros for a group under groupMaxEps) to set.
func symLevelsOf(lv *[32][8]int32, amax *[8]float32, k int, nmax int32, set func(i int, l int8)) {
	for i := 0; i < 16; i++ {
		if amax[k] < groupMaxEps {
			set(i, 0)
		} else {
			set(i, int8(lv[i][k]+nmax))
		}
	}
}

// symSearch is symGroups without the levels' last form: lv receives each
// group's levels (without nmax added), amax its largest magnitude,
// scale its scale (0 for a group under groupMaxEps).
func symSearch(x *groups, lv *[32][8]int32, amax, scale *[8]float32, q3 bool) {
	const n = 16
	nmax := int32(32)
	if q3 {
		nmax = 4
	}
	var xmax [8]float32
	signedMaxes(x, n, &xmax, amax)
	var w, wx groups // x² and x²·x, as each pass recomputes them
	squares(x, &w, &wx, n)
	var iscale [8]float32
	for k := range 8 {
		iscale[k] = float32(-nmax) / xmax[k]
	}
	var sums [2][8]float32
	symLevels(x, &w, &wx, &iscale, -nmax, nmax-1, n, lv, &sums)
	if q3 {
		q3Refine(x, &w, &wx, lv, &sums, amax, nmax)
	} else {
		qxSearch(x, &w, &wx, lv, &sums, &xmax, &iscale, scale)
	}
	for k := range 8 {
		if amax[k] < groupMaxEps {
			scale[k] = 0
			continue
		}
		if q3 {
			scale[k] = 0
			if sums[1][k] > 0 {
				scale[k] = sums[0][k] / sums[1][k]
			}
		}
	}
}

// qxSearch is make_qx_quants' search after its first pass, made at
// iscale0: lv holds that pass's levels and sums its sums; lv ends with
// each group's best levels, scale with its scale. The levels of a taken
// candidate are a function of its iscale alone, so the search keeps only
// the iscale and recomputes the levels of the winners at the end.
func qxSearch(x, w, wx *groups, lv *[32][8]int32, sums *[2][8]float32, xmax, iscale0, scale *[8]float32) {
	s := qxLanes{xmax: *xmax, useIscale: *iscale0}
	for k := range 8 {
		if sums[1][k] != 0 {
			s.scale[k] = sums[0][k] / sums[1][k]
		}
		s.best[k] = float32(s.scale[k] * sums[0][k])
	}
	qxSteps(&s, x, w, wx)
	*scale = s.scale
	if s.useIscale != *iscale0 {
		symLevels(x, w, wx, &s.useIscale, -32, 31, 16, lv, sums)
	}
}

// qxLanes is the state of make_qx_quants' search on eight groups between
// candidates: each group's max (signed) and its best scale so far, the
// figure a candidate must beat (scale·Σlx) and the iscale of its levels.
// qxStepsAVX2 reads it at the offsets of this field order.
type qxLanes struct {
	xmax, scale, best, useIscale [8]float32
}

// qxStepsGo is make_qx_quants' (nmax 32, rmse_type 1, no weights) loop
// over its 18 other scales on eight groups of 16: the levels of each and
// their sums Σ (x²·x)·l and Σ (x²·l)·l, and the candidate taken where
// Σl² > 0 and Σlx² > best·Σl².
func qxStepsGo(s *qxLanes, x, w, wx *groups) {
	var iscale [8]float32
	var try [32][8]int32
	var ts [2][8]float32
	for _, num := range qxNum {
		for k := range 8 {
			iscale[k] = num / s.xmax[k]
		}
		symLevelsGo(x, w, wx, &iscale, -32, 31, 16, &try, &ts)
		slx, sl2 := &ts[0], &ts[1]
		for k := range 8 {
			if sl2[k] > 0 && float32(slx[k]*slx[k]) > float32(s.best[k]*sl2[k]) {
				s.scale[k] = slx[k] / sl2[k]
				s.best[k] = float32(s.scale[k] * slx[k])
				s.useIscale[k] = iscale[k]
			}
		}
	}
}

// q3Refine is make_q3_quants' refinement after its first pass, on lv
// (levels) and sums in place. The passes depend on each other element by
// element, so they run one group at a time, each stopping on its own.
func q3Refine(x, w, wx *groups, lv *[32][8]int32, sums *[2][8]float32, amax *[8]float32, nmax int32) {
	const n = 16
	for k := range 8 {
		if amax[k] < groupMaxEps {
			continue
		}
		var xs, ws, wxs [n]float32
		var ls [n]int32
		for i := range n {
			xs[i], ws[i], wxs[i], ls[i] = x[i][k], w[i][k], wx[i][k], lv[i][k]
		}
		sumLX, sumL2 := sums[0][k], sums[1][k]
		for range 5 {
			changed := false
			for i := range n {
				fli := float32(ls[i])
				slx := sumLX - float32(wxs[i]*fli)
				if !(slx > 0) {
					continue
				}
				sl2 := sumL2 - float32(float32(ws[i]*fli)*fli)
				nl := clamp32(nearestInt(float32(xs[i]*sl2)/slx), -nmax, nmax-1)
				if nl == ls[i] {
					continue
				}
				fnl := float32(nl)
				slx += float32(wxs[i] * fnl)
				sl2 += float32(float32(ws[i]*fnl) * fnl)
				if sl2 > 0 && float32(float32(slx*slx)*sumL2) > float32(float32(sumLX*sumLX)*sl2) {
					ls[i], sumLX, sumL2 = nl, slx, sl2
					changed = true
				}
			}
			if !changed {
				break
			}
		}
		sums[0][k], sums[1][k] = sumLX, sumL2
		for i := range n {
			lv[i][k] = ls[i]
		}
	}
}

// symBlock quantizes the 16 groups of super-block xb with symGroups: the
// levels into L, the scales into scales.
func symBlock(xb []float32, L *[QK_K]int8, scales *[16]float32, q3 bool) {
	var (
		x  groups
		lt [32][8]int8
	)
	for h := 0; h < 2; h++ {
		x.load(xb[128*h:], 16)
		symGroups(&x, &lt, (*[8]float32)(scales[8*h:]), q3)
		for k := range 8 {
			for i := 0; i < 16; i++ {
				L[128*h+16*k+i] = lt[i][k]
			}
		}
	}
}
