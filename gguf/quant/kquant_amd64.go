package quant

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2 kernels; tests turn it off to compare them with
// the portable forms.
var useAVX2 = cpu.X86.HasAVX2

func levels(x, w *groups, lo, iscale *[8]float32, nmax int32, n int, laux *[32][8]int32, sums *[3][8]float32) {
	if useAVX2 {
		levelsAVX2(x, w, lo, iscale, nmax, n, laux, sums)
		return
	}
	levelsGo(x, w, lo, iscale, nmax, n, laux, sums)
}

func errs(x, w *groups, laux *[32][8]int32, ts, tm *[8]float32, mad bool, n int, cur *[8]float32) {
	if useAVX2 {
		errsAVX2(x, w, laux, ts, tm, mad, n, cur)
		return
	}
	errsGo(x, w, laux, ts, tm, mad, n, cur)
}

func (g *groups) load(x []float32, n int) {
	if useAVX2 && (n == 16 || n == 32) {
		x = x[:8*n]
		loadAVX2(g, &x[0], n)
		return
	}
	g.loadGo(x, n)
}

// divLevels is divLevelsGo; len(x) a multiple of 8 goes through AVX2.
func divLevels(x []float32, add, d float32, doAdd bool, lo, hi, bias int32, out []byte) {
	if useAVX2 && len(x)%8 == 0 && len(x) > 0 {
		out = out[:len(x)]
		divLevelsAVX2(&x[0], len(x), add, d, doAdd, lo, hi, bias, &out[0])
		return
	}
	divLevelsGo(x, add, d, doAdd, lo, hi, bias, out)
}

func squares(x, w, wx *groups, n int) {
	if useAVX2 {
		squaresAVX2(x, w, wx, n)
		return
	}
	squaresGo(x, w, wx, n)
}

func k45Weights(x, w *groups) {
	if useAVX2 {
		k45WeightsAVX2(x, w)
		return
	}
	k45WeightsGo(x, w)
}

func qkx2Init(x, w *groups, n int, s *qkx2Lanes) {
	if useAVX2 {
		qkx2InitAVX2(x, w, n, s)
		return
	}
	qkx2InitGo(x, w, n, s)
}

func qxSteps(s *qxLanes, x, w, wx *groups) {
	if useAVX2 {
		qxStepsAVX2(s, x, w, wx, &qxNum)
		return
	}
	qxStepsGo(s, x, w, wx)
}

func qkx2Steps(s *qkx2Lanes, x, w *groups, steps []float32, nmax int32, n int, mad bool, laux *[32][8]int32) {
	if useAVX2 {
		qkx2StepsAVX2(s, x, w, steps, nmax, n, mad, laux)
		return
	}
	qkx2StepsGo(s, x, w, steps, nmax, n, mad, laux)
}

func symLevels(x, w, wx *groups, iscale *[8]float32, lo, hi int32, n int, lv *[32][8]int32, sums *[2][8]float32) {
	if useAVX2 {
		symLevelsAVX2(x, w, wx, iscale, lo, hi, n, lv, sums)
		return
	}
	symLevelsGo(x, w, wx, iscale, lo, hi, n, lv, sums)
}

func signedMaxes(x *groups, n int, xmax, amax *[8]float32) {
	if useAVX2 {
		signedMaxAVX2(x, n, xmax, amax)
		return
	}
	signedMaxesGo(x, n, xmax, amax)
}

//go:noescape
func signedMaxAVX2(x *groups, n int, xmax, amax *[8]float32)

//go:noescape
func levelsAVX2(x, w *groups, lo, iscale *[8]float32, nmax int32, n int, laux *[32][8]int32, sums *[3][8]float32)

//go:noescape
func errsAVX2(x, w *groups, laux *[32][8]int32, ts, tm *[8]float32, mad bool, n int, cur *[8]float32)

//go:noescape
func symLevelsAVX2(x, w, wx *groups, iscale *[8]float32, lo, hi int32, n int, lv *[32][8]int32, sums *[2][8]float32)

//go:noescape
func qkx2StepsAVX2(s *qkx2Lanes, x, w *groups, steps []float32, nmax int32, n int, mad bool, laux *[32][8]int32)

//go:noescape
func qkx2InitAVX2(x, w *groups, n int, s *qkx2Lanes)

//go:noescape
func qxStepsAVX2(s *qxLanes, x, w, wx *groups, nums *[18]float32)

//go:noescape
func divLevelsAVX2(x *float32, n int, add, d float32, doAdd bool, lo, hi, bias int32, out *byte)

//go:noescape
func loadAVX2(dst *groups, x *float32, n int)

//go:noescape
func squaresAVX2(x, w, wx *groups, n int)

//go:noescape
func k45WeightsAVX2(x, w *groups)
