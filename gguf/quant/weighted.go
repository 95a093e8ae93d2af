package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// The importance-weighted encoders are what ggml's quantize_q2_K …
// quantize_q6_K and quantize_q4_0 … quantize_q5_1 (ggml/src/ggml-quants.c
// at llama.cpp 34af94c) run when
// llama-quantize passes them an importance matrix: quantize_row_*_impl
// with quant_weights, row by row, every row of a matrix with the same
// vector of n_per_row weights. They follow the rules of the reference
// encoders in kquant.go (float32 in the reference's order, sequential sums,
// every product rounded on its own by an explicit float32 conversion so
// that it cannot fuse into an FMA, nearestInt, half rounding), so they are
// bit-exact with llama-quantize on every platform.
//
// What the importance vector w of a row changes, per type:
//
//   - Q2_K: each 16-value group is fitted by make_qkx3_quants with weights
//     w·√(σ² + x²), σ² the mean square of the 256-value block; the 16
//     scales and the 16 minimums are each quantized to 4 bits by
//     make_qp_quants, weighted by the groups' summed weights.
//   - Q3_K: groups fitted by make_qx_quants with w·√(2σ² + x²); the scales
//     quantized to 6 bits by make_qx_quants weighted by the group sums.
//   - Q4_K, Q5_K: 32-value groups by make_qkx3_quants with w·√(2σ² + x²);
//     scales and minimums to 6 bits by make_qp_quants.
//   - Q6_K: groups by make_qx_quants with the bare w (no σ²); the rest as
//     without weights.
//   - Q4_0, Q5_0 (make_qx_quants) and Q4_1, Q5_1 (make_qkx3_quants): one
//     block at a time with w·√(σ² + x²), σ² the mean square of the whole
//     row.
//   - Q8_0, F16, BF16, F32: the weights are ignored.
//
// Every encoder here keeps its scratch on the stack and is a pure function
// of (dst, src, weights), safe to run concurrently on disjoint rows.

// EncodeWeighted writes src, whole rows of rowLen values, into dst as type
// t, quantizing every row with the importance weights (rowLen values, one
// per column) as llama-quantize does with an importance matrix. For a
// tensor of several matrices (experts: ne2 > 1) the weights differ per
// matrix: pass the rows of matrix e with weights[e·rowLen : (e+1)·rowLen]
// of the vector imatrix.Matrix.Weights gives.
//
// Nil weights are Encode: llama-quantize quantizes a tensor the matrix has
// no entry for with the reference paths, not the weighted ones with no
// weights. Q8_0, F16, BF16 and F32 ignore the weights, as ggml does.
// rowLen must be a whole number of t's blocks and divide len(src).
func EncodeWeighted(t Type, dst []byte, src []float32, rowLen int, weights []float32) error {
	r := t.row()
	if r.Encode == nil {
		return fmt.Errorf("%w for %s", ErrNoEncoder, t)
	}
	if rowLen <= 0 || len(src)%rowLen != 0 {
		return fmt.Errorf("%s: %d values are not whole rows of %d", t, len(src), rowLen)
	}
	rowBytes, err := r.blockBytes(rowLen, math.MaxInt)
	if err != nil {
		return err
	}
	if _, err := r.blockBytes(len(src), len(dst)); err != nil {
		return err
	}
	if weights != nil && len(weights) != rowLen {
		return fmt.Errorf("%s: %d importance weights for rows of %d", t, len(weights), rowLen)
	}
	if weights == nil || r.EncodeWeighted == nil {
		r.Encode(dst, src)
		return nil
	}
	for i := 0; i*rowLen < len(src); i++ {
		r.EncodeWeighted(dst[i*rowBytes:(i+1)*rowBytes], src[i*rowLen:(i+1)*rowLen], weights)
	}
	return nil
}

// Parameters of every make_qkx3_quants call in the weighted paths.
const (
	qkx3Rmin   float32 = -0.9
	qkx3Rdelta float32 = 0.05
	qkx3Nstep          = 36
)

// make_qkx3_quants with weights is make_qkx2_quants (its max <= min is
// max == min once min is at most 0, and nstep is not below 1), so the K
// types' groups run eight at a time on the lanes of kquant_lanes.go.
var (
	qkx3Q2 = newQKX2(16, 3, qkx3Rmin, qkx3Rdelta, qkx3Nstep, false)
	qkx3Q4 = newQKX2(32, 15, qkx3Rmin, qkx3Rdelta, qkx3Nstep, false)
	qkx3Q5 = newQKX2(32, 31, qkx3Rmin, qkx3Rdelta, qkx3Nstep, false)
)

// sumSquares is Σ x² in index order.
func sumSquares(x []float32) float32 {
	var s float32
	for _, v := range x {
		s += float32(v * v)
	}
	return s
}

// importance fills w with qw·√(sigma2 + x²), the weights the _impl paths
// give their group fitters, and returns their sum in index order.
func importance(w, x, qw []float32, sigma2 float32) float32 {
	w = w[:len(x)]
	qw = qw[:len(x)]
	var sum float32
	for i, v := range x {
		w[i] = float32(qw[i] * sqrt32(sigma2+float32(v*v))) // rounded before the sum
		sum += w[i]
	}
	return sum
}

// makeQKX3 is make_qkx3_quants with weights w and the parameters every
// weighted path uses (rmin -0.9, rdelta 0.05, 36 steps, squared error):
// the scale and the negated minimum of an asymmetric quantization of x to
// levels 0…nmax. L receives the levels; laux is scratch of len(x).
func makeQKX3(x, w []float32, L, laux []uint8, nmax int32) (scale, theMin float32) {
	n := len(x)
	w, L, laux = w[:n], L[:n], laux[:n]
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
	if hi <= lo {
		clear(L)
		return 0, -lo
	}
	fmax := float32(nmax)
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var xm [32]float32 // x - min, as each pass computes it until min changes
	for i, v := range x {
		xm[i] = v - lo
	}
	var best float32
	for i, v := range x {
		l := uint8(clamp32(nearestInt(float32(iscale*xm[i])), 0, nmax))
		L[i] = l
		diff := float32(scale*float32(l)) + lo - v
		best += float32(w[i] * float32(diff*diff))
	}
	for is := 0; is <= qkx3Nstep; is++ {
		iscale = (qkx3Rmin + float32(qkx3Rdelta*float32(is)) + fmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := clamp32(nearestInt(float32(iscale*xm[i])), 0, nmax)
			laux[i] = uint8(l)
			fl := float32(l)
			wl := float32(w[i] * fl)
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * v)
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if !(D > 0) {
			continue
		}
		ts := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
		tm := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
		if tm > 0 {
			tm = 0
			ts = sumXL / sumL2
		}
		var cur float32
		for i, v := range x {
			diff := float32(ts*float32(laux[i])) + tm - v
			cur += float32(w[i] * float32(diff*diff))
		}
		if cur < best {
			copy(L, laux)
			best, scale, lo = cur, ts, tm
			for i, v := range x {
				xm[i] = v - lo
			}
		}
	}
	return scale, -lo
}

// weightedSums rounds iscale·x to levels l in [-nmax, nmax-1], stores
// l+nmax in L and returns Σ (w·x)·l and Σ (w·l)·l in index order, a pass
// of make_qx_quants with importance weights w.
func weightedSums(x, w []float32, L []int8, iscale float32, nmax int32) (sumLX, sumL2 float32) {
	for i, v := range x {
		l := clamp32(nearestInt(float32(iscale*v)), -nmax, nmax-1)
		L[i] = int8(l + nmax)
		fl := float32(l)
		sumLX += float32(float32(w[i]*v) * fl)
		sumL2 += float32(float32(w[i]*fl) * fl)
	}
	return sumLX, sumL2
}

// makeQXW is make_qx_quants with rmse_type 1 and importance weights w (at
// most 32 values): the scale of a symmetric quantization of x into
// [-nmax, nmax-1], trying 18 scales around nmax/max|x|. L receives the
// levels plus nmax.
func makeQXW(x, w []float32, L []int8, nmax int32) float32 {
	n := len(x)
	w, L = w[:n], L[:n]
	xmax, amax := signedMax(x)
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	sumLX, sumL2 := weightedSums(x, w, L, float32(-nmax)/xmax, nmax)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	fmax := float32(nmax)
	var try [32]int8
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(fmax + float32(0.1*float32(is))) / xmax
		slx, sl2 := weightedSums(x, w, try[:n], iscale, nmax)
		if sl2 > 0 && float32(slx*slx) > float32(best*sl2) {
			copy(L, try[:n])
			scale = slx / sl2
			best = float32(scale * slx)
		}
	}
	return scale
}

// makeQP is make_qp_quants: the scale of a quantization of the
// non-negative x (group scales or minimums) to levels 0…nmax under
// weights w, the best of nine scales around nmax/max(x), then refined one
// level at a time for up to five passes. L receives the levels as the C
// uint8_t array holds them: a negative level (a negative x) wraps.
func makeQP(x, w []float32, L []uint8, nmax int32) float32 {
	n := len(x)
	w, L = w[:n], L[:n]
	var xmax float32
	for _, v := range x {
		if !(xmax > v) { // MAX(max, x[i]): a NaN is taken, then dropped
			xmax = v
		}
	}
	if xmax < groupMaxEps {
		clear(L)
		return 0
	}
	fmax := float32(nmax)
	iscale := fmax / xmax
	for i, v := range x {
		L[i] = uint8(nearestInt(float32(iscale * v)))
	}
	scale := 1 / iscale
	var best float32
	for i, v := range x {
		diff := v - float32(scale*float32(L[i]))
		best += float32(float32(w[i]*diff) * diff)
	}
	for is := int32(-4); is <= 4; is++ {
		if is == 0 {
			continue
		}
		iscaleIs := (float32(0.1*float32(is)) + fmax) / xmax
		scaleIs := 1 / iscaleIs
		var mse float32
		for i, v := range x {
			l := min(nmax, nearestInt(float32(iscaleIs*v)))
			diff := v - float32(scaleIs*float32(l))
			mse += float32(float32(w[i]*diff) * diff)
		}
		if mse < best {
			best, iscale = mse, iscaleIs
		}
	}
	var sumLX, sumL2 float32
	for i, v := range x {
		l := min(nmax, nearestInt(float32(iscale*v)))
		L[i] = uint8(l)
		fl := float32(l)
		sumLX += float32(float32(w[i]*v) * fl)
		sumL2 += float32(float32(w[i]*fl) * fl)
	}
	for range 5 {
		changed := false
		for i, v := range x {
			wi, fli := w[i], float32(L[i])
			slx := sumLX - float32(float32(wi*v)*fli)
			sl2 := sumL2 - float32(float32(wi*fli)*fli)
			if !(slx > 0 && sl2 > 0) {
				continue
			}
			nl := min(nmax, nearestInt(float32(v*sl2)/slx))
			if nl == int32(L[i]) {
				continue
			}
			fnl := float32(nl)
			slx += float32(float32(wi*v) * fnl)
			sl2 += float32(float32(wi*fnl) * fnl)
			if float32(float32(slx*slx)*sumL2) > float32(float32(sumLX*sumLX)*sl2) {
				L[i] = uint8(nl)
				sumLX, sumL2 = slx, sl2
				changed = true
			}
		}
		if !changed {
			break
		}
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// weightedQ2_K is quantize_row_q2_K_impl.
func weightedQ2_K(dst []byte, src, qw []float32) {
	var (
		L                  [QK_K]uint8
		xg, wg             groups
		lt                 [32][8]uint8
		w                  [16]float32
		scales, minima, sw [16]float32
		ls, lm             [16]uint8
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		x := src[bi*QK_K : bi*QK_K+QK_K]
		q := qw[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*84 : bi*84+84]
		sigma2 := sumSquares(x) / QK_K
		for h := range 2 {
			xg.load(x[128*h:], 16)
			for k := range 8 {
				j := 8*h + k
				sw[j] = importance(w[:], x[16*j:16*j+16], q[16*j:], sigma2)
				for i, v := range w {
					wg[i][k] = v
				}
			}
			qkx3Q2.run(&xg, &wg, &lt, (*[8]float32)(scales[8*h:]), (*[8]float32)(minima[8*h:]))
			for k := range 8 {
				for i := range 16 {
					L[128*h+16*k+i] = lt[i][k]
				}
			}
		}
		dm := makeQP(scales[:], sw[:], ls[:], 15)
		mm := makeQP(minima[:], sw[:], lm[:], 15)
		sc := y[:16]
		for j := range 16 {
			sc[j] = ls[j] | lm[j]<<4
		}
		q2Levels(y, x, &L, dm, mm)
	}
}

// weightedQ3_K is quantize_row_q3_K_impl.
func weightedQ3_K(dst []byte, src, qw []float32) {
	var (
		L          [QK_K]int8
		w          [16]float32
		scales, sw [16]float32
		ls         [16]int8
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		x := src[bi*QK_K : bi*QK_K+QK_K]
		q := qw[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*110 : bi*110+110]
		sigma2 := 2 * sumSquares(x) / QK_K
		for j := range 16 {
			xs := x[16*j : 16*j+16]
			sw[j] = importance(w[:], xs, q[16*j:], sigma2)
			scales[j] = makeQXW(xs, w[:], L[16*j:], 4)
		}
		sc := y[96:108]
		clear(sc)
		d := makeQXW(scales[:], sw[:], ls[:], 32)
		for j, l := range ls {
			if j < 8 {
				sc[j] = byte(l & 0xF)
			} else {
				sc[j-8] |= byte(l&0xF) << 4
			}
			sc[j%4+8] |= byte(l>>4) << (2 * (j / 4))
		}
		q3Levels(y, x, &L, d)
	}
}

// q3Levels stores d as half into a Q3_K block y whose scales (y[96:108])
// are set, re-quantizes x with them, then writes the levels: the third
// bits into hmask, the low two into qs. Levels of a group whose scale is
// zero are kept from L.
func q3Levels(y []byte, x []float32, L *[QK_K]int8, d float32) {
	dh, df := toHalf(d)
	binary.LittleEndian.PutUint16(y[108:], dh)
	sc := y[96:108]
	for j := range 16 {
		dl := df * float32(q3Scale(sc, j)-32)
		if dl == 0 {
			continue
		}
		for i, v := range x[16*j : 16*j+16] {
			L[16*j+i] = int8(clamp32(nearestInt(v/dl), -4, 3) + 4)
		}
	}
	hm := y[:32]
	var low [QK_K]uint8
	// Levels are 0…7: bit 2 of level 32b+m is bit b of hmask[m].
	for m := range 32 {
		var h uint8
		for b := range 8 {
			l := uint8(L[32*b+m])
			h |= l >> 2 << b
			low[32*b+m] = l & 3
		}
		hm[m] = h
	}
	pack2(y[32:96], &low)
}

// weightedK45 is the common body of quantize_row_q4_K_impl and
// quantize_row_q5_K_impl for one block: 8 groups of 32 fitted to levels
// 0…nmax, their scales and minimums to 6 bits (clamped to 63 when clamp,
// as Q5_K does; Q4_K stores make_qp_quants's byte as it is). It writes d,
// dmin and the scales into y[:16] and leaves the levels in L.
func weightedK45(y []byte, x, q []float32, L *[QK_K]uint8, p *qkx2, clamp bool) {
	var (
		xg, wg             groups
		lt                 [32][8]uint8
		w                  [32]float32
		scales, minima, sw [8]float32
		ls, lm             [8]uint8
	)
	sigma2 := 2 * sumSquares(x) / QK_K
	xg.load(x, 32)
	for k := range 8 {
		sw[k] = importance(w[:], x[32*k:32*k+32], q[32*k:], sigma2)
		for i, v := range w {
			wg[i][k] = v
		}
	}
	p.run(&xg, &wg, &lt, &scales, &minima)
	for k := range 8 {
		for i := range 32 {
			L[32*k+i] = lt[i][k]
		}
	}
	d := makeQP(scales[:], sw[:], ls[:], 63)
	m := makeQP(minima[:], sw[:], lm[:], 63)
	if clamp {
		for j := range 8 {
			ls[j], lm[j] = min(63, ls[j]), min(63, lm[j])
		}
	}
	kScales(y[4:16], &ls, &lm)
	k45Levels(y, x, L, nil, d, m, p.nmax)
}

// k45Levels stores d and dmin as half into a Q4_K or Q5_K block y whose
// scales are packed, then re-quantizes x with them to levels 0…nmax in L
// (those of a group whose scale is zero are kept).
func k45Levels(y []byte, x []float32, L *[QK_K]uint8, lt *[32][8]uint8, d, dmin float32, nmax int32) {
	dh, df := toHalf(d)
	mh, mf := toHalf(dmin)
	binary.LittleEndian.PutUint16(y[0:], dh)
	binary.LittleEndian.PutUint16(y[2:], mh)
	for j := range 8 {
		s, mi := scaleMinK4(j, y[4:16])
		dl := df * float32(s)
		if dl == 0 {
			if lt != nil { // the search's levels, transposed
				for i := range 32 {
					L[32*j+i] = lt[i][j]
				}
			}
			continue
		}
		dm := float32(mf * float32(mi))
		divLevels(x[32*j:32*j+32], dm, dl, true, 0, nmax, 0, L[32*j:32*j+32])
	}
}

// weightedQ4_K is quantize_row_q4_K_impl.
func weightedQ4_K(dst []byte, src, qw []float32) {
	var L [QK_K]uint8
	for bi := 0; bi*QK_K < len(src); bi++ {
		y := dst[bi*144 : bi*144+144]
		weightedK45(y, src[bi*QK_K:bi*QK_K+QK_K], qw[bi*QK_K:bi*QK_K+QK_K], &L, &qkx3Q4, false)
		packQ4_K(y[16:144], &L)
	}
}

// packQ4_K stores 256 four-bit levels as Q4_K's qs: in each 64-value
// chunk c, byte l of qs[32c:] holds level l (low nibble) and l+32.
func packQ4_K(qs []byte, L *[QK_K]uint8) {
	qs = qs[:128]
	for c := range 4 {
		for l := range 32 {
			qs[32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
		}
	}
}

// weightedQ5_K is quantize_row_q5_K_impl.
func weightedQ5_K(dst []byte, src, qw []float32) {
	var L [QK_K]uint8
	for bi := 0; bi*QK_K < len(src); bi++ {
		y := dst[bi*176 : bi*176+176]
		weightedK45(y, src[bi*QK_K:bi*QK_K+QK_K], qw[bi*QK_K:bi*QK_K+QK_K], &L, &qkx3Q5, true)
		packQ5_K(y[16:48], y[48:176], &L)
	}
}

// packQ5_K stores 256 five-bit levels as Q5_K's qh (the fifth bits: level
// l and l+32 of chunk c at bits 2c and 2c+1 of byte l) and qs (the low
// four, laid out as Q4_K's).
func packQ5_K(qh, qs []byte, L *[QK_K]uint8) {
	qh, qs = qh[:32], qs[:128]
	clear(qh)
	for c := range 4 {
		for j := range 32 {
			l1, l2 := L[64*c+j], L[64*c+32+j]
			qh[j] |= l1>>4<<(2*c) | l2>>4<<(2*c+1)
			qs[32*c+j] = l1&0xF | (l2&0xF)<<4
		}
	}
}

// weightedQ6_K is quantize_row_q6_K_impl: the groups are fitted under the
// importance weights themselves, the rest is quantize_row_q6_K_ref.
func weightedQ6_K(dst []byte, src, qw []float32) {
	var (
		L      [QK_K]int8
		scales [16]float32
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		x := src[bi*QK_K : bi*QK_K+QK_K]
		q := qw[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*210 : bi*210+210]
		for j := range 16 {
			scales[j] = makeQXW(x[16*j:16*j+16], q[16*j:], L[16*j:], 32)
		}
		q6Block(y, x, &L, &scales, nil)
	}
}

// q6Block finishes a Q6_K block y from its 16 group scales (and the
// groups' levels plus 32 in L, kept for a group whose scale rounds to
// zero): d = the largest-magnitude scale / -128 as half, the scales as
// int8 of d, x re-quantized to -32…31 with them, and the levels packed. A
// block whose scales are all below GROUP_MAX_EPS is all zero.
func q6Block(y []byte, x []float32, L *[QK_K]int8, scales *[16]float32, lazy *q6Lazy) {
	maxScale, maxAbs := signedMax(scales[:])
	if maxAbs < groupMaxEps {
		clear(y)
		return
	}
	iscale := -128 / maxScale
	dh, df := toHalf(1 / iscale)
	binary.LittleEndian.PutUint16(y[208:], dh)
	sc := y[192:208]
	for j := range 16 {
		sc[j] = byte(int8(min(127, nearestInt(float32(iscale*scales[j])))))
	}
	for j := range 16 {
		d := df * float32(int8(sc[j]))
		if d == 0 {
			if lazy != nil { // the search's levels, as symGroups lays them out
				symLevelsOf(&lazy.lv[j/8], &lazy.amax[j/8], j%8, 32, func(i int, l int8) { L[16*j+i] = l })
			}
			continue
		}
		divLevels(x[16*j:16*j+16], 0, d, false, -32, 31, 32, unsafe.Slice((*byte)(unsafe.Pointer(&L[16*j])), 16))
	}
	ql, qh := y[:128], y[128:192]
	for h := range 2 {
		for l := range 32 {
			j := 128*h + l
			q1, q2, q3, q4 := uint8(L[j]), uint8(L[j+32]), uint8(L[j+64]), uint8(L[j+96])
			ql[64*h+l] = q1&0xF | (q3&0xF)<<4
			ql[64*h+32+l] = q2&0xF | (q4&0xF)<<4
			qh[32*h+l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
		}
	}
}

// encodeWeighted is quantize_row_q{4,5}_{0,1}_impl for one row: σ² is the
// mean square of the whole row, each 32-value block fitted under
// qw·√(σ² + x²) by make_qx_quants (symmetric types) or make_qkx3_quants
// (affine types).
func (l legacy) encodeWeighted(dst []byte, src, qw []float32) {
	size, _, _ := l.offsets()
	nmax := int32(1)<<l.bits - 1
	sigma2 := sumSquares(src) / float32(len(src))
	var (
		w    [32]float32
		q    [32]uint8
		laux [32]uint8
		L    [32]int8
	)
	for bi := 0; bi*32 < len(src); bi++ {
		x := src[bi*32 : bi*32+32]
		out := dst[bi*size : bi*size+size]
		importance(w[:], x, qw[bi*32:], sigma2)
		if l.affine {
			d, m := makeQKX3(x, w[:], q[:], laux[:], nmax)
			putHalf(out, d)
			putHalf(out[2:], -m)
		} else {
			putHalf(out, makeQXW(x, w[:], L[:], (nmax+1)/2))
			for j, v := range L {
				q[j] = uint8(v)
			}
		}
		l.pack(out, &q)
	}
}
