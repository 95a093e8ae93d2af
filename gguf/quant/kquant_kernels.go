package quant

// The inner loops of the lane-parallel group quantizers, each over n rows
// of eight lanes. These are the portable forms; kquant_amd64.s has AVX2
// forms that do the same operations on all eight lanes at once (one
// instruction per scalar operation, no FMA), selected when the CPU has
// AVX2. TestKernelsMatch checks that both give the same bits.

// The kernels are called directly (levels, errs and symLevels in
// kquant_amd64.go and kquant_other.go pick a form): through a function
// value the compiler could not keep their arrays on the stack.
//
// levels is the per-candidate pass of make_qkx2_quants: each level
// l = clamp(nearest_int(iscale·(x - lo)), 0, nmax) into laux, and the sums
// Σ w·l, Σ (w·l)·l and Σ (w·l)·x in index order into sums[0..2].
//
// errs is the error pass of make_qkx2_quants: cur = Σ w·e with
// diff = ts·l + tm - x and e = |diff| (mad) or diff².
//
// signedMaxes is, per lane, the first value of largest magnitude and that
// magnitude (make_qx_quants' and make_q3_quants' max and amax).
//
// symLevels is a pass of make_qx_quants or make_q3_quants: each level
// l = clamp(nearest_int(iscale·x), lo, hi) into lv, and the sums
// Σ (x²·x)·l and Σ (x²·l)·l in index order into sums[0..1]; w is x², wx
// is x²·x.

// The portable forms run one lane at a time, so that each lane's sums stay
// in registers.

func levelsGo(x, w *groups, lo, iscale *[8]float32, nmax int32, n int, laux *[32][8]int32, sums *[3][8]float32) {
	for k := range 8 {
		var sL, sL2, sXL float32
		is, m := iscale[k], lo[k]
		for i := 0; i < n; i++ {
			v := x[i][k]
			l := clamp32(nearestInt(float32(is*(v-m))), 0, nmax)
			laux[i][k] = l
			fl := float32(l)
			wl := float32(w[i][k] * fl)
			sL += wl
			sL2 += float32(wl * fl)
			sXL += float32(wl * v)
		}
		sums[0][k], sums[1][k], sums[2][k] = sL, sL2, sXL
	}
}

func errsGo(x, w *groups, laux *[32][8]int32, ts, tm *[8]float32, mad bool, n int, cur *[8]float32) {
	for k := range 8 {
		var c float32
		s, m := ts[k], tm[k]
		for i := 0; i < n; i++ {
			diff := float32(s*float32(laux[i][k])) + m - x[i][k]
			if mad {
				diff = abs32(diff)
			} else {
				diff = float32(diff * diff)
			}
			c += float32(w[i][k] * diff)
		}
		cur[k] = c
	}
}

func symLevelsGo(x, w, wx *groups, iscale *[8]float32, lo, hi int32, n int, lv *[32][8]int32, sums *[2][8]float32) {
	for k := range 8 {
		var sLX, sL2 float32
		is := iscale[k]
		for i := 0; i < n; i++ {
			l := clamp32(nearestInt(float32(is*x[i][k])), lo, hi)
			lv[i][k] = l
			fl := float32(l)
			sLX += float32(wx[i][k] * fl)
			sL2 += float32(float32(w[i][k]*fl) * fl)
		}
		sums[0][k], sums[1][k] = sLX, sL2
	}
}

func signedMaxesGo(x *groups, n int, xmax, amax *[8]float32) {
	for k := range 8 {
		var m, a float32
		for i := 0; i < n; i++ {
			if v := abs32(x[i][k]); v > a {
				a, m = v, x[i][k]
			}
		}
		xmax[k], amax[k] = m, a
	}
}

// divLevelsGo is the last pass of the K types' reference quantizers, the
// levels from the block's quantized scale: out[i] = clamp(nearest_int((x[i]
// + add) / d), lo, hi) + bias, without the addition when doAdd is false.
func divLevelsGo(x []float32, add, d float32, doAdd bool, lo, hi, bias int32, out []byte) {
	out = out[:len(x)]
	for i, v := range x {
		if doAdd {
			v += add
		}
		out[i] = byte(clamp32(nearestInt(v/d), lo, hi) + bias)
	}
}

// squaresGo sets w = x² and wx = w·x on n rows of eight lanes (the
// weights make_qx_quants and make_q3_quants compute from the values).
func squaresGo(x, w, wx *groups, n int) {
	for i := 0; i < n; i++ {
		for k := range 8 {
			v := x[i][k]
			w[i][k] = float32(v * v)
			wx[i][k] = float32(w[i][k] * v)
		}
	}
}

// k45WeightsGo is quantize_row_q4_K_ref's (and q5_K's) weights on eight
// groups of 32: av_x = √(Σx²/32) per group (the sum in index order), then
// w = av_x + |x|.
func k45WeightsGo(x, w *groups) {
	var sumX2 [8]float32
	for i := range 32 {
		for k := range 8 {
			sumX2[k] += float32(x[i][k] * x[i][k])
		}
	}
	for k := range 8 {
		sumX2[k] = sqrt32(sumX2[k] / 32) // av_x
	}
	for i := range 32 {
		for k := range 8 {
			w[i][k] = sumX2[k] + abs32(x[i][k])
		}
	}
}
