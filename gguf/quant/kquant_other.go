//go:build !amd64

package quant

// The group kernels have no vector forms on this architecture.

var useAVX2 = false

func levels(x, w *groups, lo, iscale *[8]float32, nmax int32, n int, laux *[32][8]int32, sums *[3][8]float32) {
	levelsGo(x, w, lo, iscale, nmax, n, laux, sums)
}

func errs(x, w *groups, laux *[32][8]int32, ts, tm *[8]float32, mad bool, n int, cur *[8]float32) {
	errsGo(x, w, laux, ts, tm, mad, n, cur)
}

func (g *groups) load(x []float32, n int) { g.loadGo(x, n) }

func divLevels(x []float32, add, d float32, doAdd bool, lo, hi, bias int32, out []byte) {
	divLevelsGo(x, add, d, doAdd, lo, hi, bias, out)
}

func squares(x, w, wx *groups, n int) { squaresGo(x, w, wx, n) }

func k45Weights(x, w *groups) { k45WeightsGo(x, w) }

func qkx2Init(x, w *groups, n int, s *qkx2Lanes) { qkx2InitGo(x, w, n, s) }

func qxSteps(s *qxLanes, x, w, wx *groups) { qxStepsGo(s, x, w, wx) }

func qkx2Steps(s *qkx2Lanes, x, w *groups, steps []float32, nmax int32, n int, mad bool, laux *[32][8]int32) {
	qkx2StepsGo(s, x, w, steps, nmax, n, mad, laux)
}

func symLevels(x, w, wx *groups, iscale *[8]float32, lo, hi int32, n int, lv *[32][8]int32, sums *[2][8]float32) {
	symLevelsGo(x, w, wx, iscale, lo, hi, n, lv, sums)
}

func signedMaxes(x *groups, n int, xmax, amax *[8]float32) { signedMaxesGo(x, n, xmax, amax) }
