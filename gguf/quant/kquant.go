package quant

import (
	"encoding/binary"
	"math"

	"github.com/ferry-llm/ferry/tensor"
)

// The K-quant encoders are ggml's reference paths without an importance
// matrix, quantize_row_qN_K_ref in ggml/src/ggml-quants.c at llama.cpp
// 34af94c (../shared/notes/llamacpp.md §2): what llama-quantize runs for
// Q2_K…Q6_K when no imatrix is given. They are bit-exact with it on every
// platform:
//
//   - all arithmetic is float32, in the reference's order of operations,
//     every sum accumulated sequentially in index order;
//   - every product that feeds an addition or a comparison is wrapped in an
//     explicit float32(...) conversion: the Go spec lets a compiler fuse
//     x*y+z into one FMA (arm64 does) unless a conversion rounds the
//     product first, and the reference (ggml-base, built without -march on
//     x86-64) never fuses;
//   - rounding to an integer is nearestInt, the reference's float trick,
//     and the integer stores wrap exactly as the C assignments do;
//   - d and dmin are rounded to half (RNE) and read back before the final
//     quants are computed, as the reference does.
//
// The sub-block searches (make_qkx2_quants, make_qx_quants,
// make_q3_quants) run eight sub-blocks at once, one per lane
// (kquant_lanes.go), with AVX2 kernels where the CPU has them
// (kquant_amd64.s); each lane does its sub-block's scalar operations in
// the scalar order, so the bits do not change.
//
// Each encoder is a pure function of (dst, src) with its scratch on the
// stack, so a caller may run many at once on disjoint blocks.

// groupMaxEps is GROUP_MAX_EPS: a group whose largest magnitude is below it
// is all zero.
const groupMaxEps float32 = 1e-15

// nearestInt is the reference's nearest_int: add 1.5·2^23 in float32 and
// read the low mantissa bits, which rounds half to even for |f| ≤ 4194303.
// Outside that range (the reference only asserts it, and builds without
// asserts) the result is whatever the same bits give, reproduced here too.
// Callers pass an already rounded float32: wrap a product argument in
// float32(...) so the addition cannot fuse with it.
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x007fffff) - 0x00400000
}

func sqrt32(f float32) float32 { return float32(math.Sqrt(float64(f))) }

func clamp32(l, lo, hi int32) int32 { return max(lo, min(hi, l)) }

// toHalf rounds f to IEEE half (GGML_FP32_TO_FP16: RNE, subnormals,
// overflow to Inf) and returns both the bits and the value read back from
// them.
func toHalf(f float32) (uint16, float32) {
	h := tensor.Float32ToF16(f)
	return h, tensor.F16ToFloat32(h)
}

// pack2 stores 256 two-bit levels as Q2_K and Q3_K do: in each 128-value
// half, byte l holds levels l, l+32, l+64 and l+96 from the low bits up.
func pack2(qs []byte, L *[QK_K]uint8) {
	qs = qs[:64]
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			j := 128*h + l
			qs[32*h+l] = L[j] | L[j+32]<<2 | L[j+64]<<4 | L[j+96]<<6
		}
	}
}

// loadGo transposes 8 groups of n values, group k at x[n*k:], into g
// (groups.load picks this or an AVX2 form).
func (g *groups) loadGo(x []float32, n int) {
	x = x[:8*n]
	for k := range 8 {
		xk := x[n*k : n*k+n]
		for i, v := range xk {
			g[i][k] = v
		}
	}
}

// quantizeQ2_K is quantize_row_q2_K_ref: 84-byte blocks of scales[16] (low
// nibble scale, high nibble min), qs[64], d and dmin as half.
func quantizeQ2_K(dst []byte, src []float32) {
	var (
		x, w           groups
		lt             [32][8]uint8
		L              [QK_K]uint8
		scales, minima [16]float32
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		xb := src[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*84 : bi*84+84]
		for h := 0; h < 2; h++ {
			x.load(xb[128*h:], 16)
			for i := 0; i < 16; i++ {
				for k := range 8 {
					w[i][k] = abs32(x[i][k])
				}
			}
			qkx2Q2.run(&x, &w, &lt, (*[8]float32)(scales[8*h:]), (*[8]float32)(minima[8*h:]))
			for k := range 8 {
				for i := 0; i < 16; i++ {
					L[128*h+16*k+i] = lt[i][k]
				}
			}
		}
		maxScale, maxMin := maxima(scales[:], minima[:])
		sc := y[:16]
		var d, dmin float32
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range 16 {
				sc[j] = byte(nearestInt(float32(iscale * scales[j])))
			}
			d = maxScale / 15
		} else {
			clear(sc)
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range 16 {
				sc[j] |= byte(nearestInt(float32(iscale*minima[j])) << 4)
			}
			dmin = maxMin / 15
		}
		q2Levels(y, xb, &L, d, dmin)
	}
}

// q2Levels stores d and dmin as half into a Q2_K block y whose scales
// (y[:16]) are set, then re-quantizes x with them to levels 0…3 (those of
// a group whose scale is zero are kept from L) and packs the levels.
func q2Levels(y []byte, x []float32, L *[QK_K]uint8, d, dmin float32) {
	dh, df := toHalf(d)
	mh, mf := toHalf(dmin)
	binary.LittleEndian.PutUint16(y[80:], dh)
	binary.LittleEndian.PutUint16(y[82:], mh)
	sc := y[:16]
	for j := range 16 {
		dl := df * float32(sc[j]&0xF)
		if dl == 0 {
			continue
		}
		dm := float32(mf * float32(sc[j]>>4))
		for i, v := range x[16*j : 16*j+16] {
			L[16*j+i] = uint8(clamp32(nearestInt((v+dm)/dl), 0, 3))
		}
	}
	pack2(y[16:80], L)
}

// maxima is the largest of scales and the largest of minima, each at
// least 0.
func maxima(scales, minima []float32) (maxScale, maxMin float32) {
	for j := range scales {
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if minima[j] > maxMin {
			maxMin = minima[j]
		}
	}
	return maxScale, maxMin
}

// quantizeQ3_K is quantize_row_q3_K_ref: 110-byte blocks of hmask[32] (the
// third bit of each level), qs[64] (the low two), scales[12] (16 six-bit
// scales biased by 32) and d as half.
func quantizeQ3_K(dst []byte, src []float32) {
	var (
		L      [QK_K]int8
		scales [16]float32
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		xb := src[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*110 : bi*110+110]
		symBlock(xb, &L, &scales, true)
		maxScale, _ := signedMax(scales[:])
		sc := y[96:108]
		clear(sc)
		var d float32
		if maxScale != 0 {
			iscale := -32 / maxScale
			for j := range 16 {
				l := int8(nearestInt(float32(iscale * scales[j])))
				l = max(-32, min(31, l)) + 32
				if j < 8 {
					sc[j] = byte(l & 0xF)
				} else {
					sc[j-8] |= byte(l&0xF) << 4
				}
				l >>= 4
				sc[j%4+8] |= byte(l << (2 * (j / 4)))
			}
			d = 1 / iscale
		}
		q3Levels(y, xb, &L, d)
	}
}

// kScales packs eight 6-bit scales and minimums into the 12 bytes of Q4_K
// and Q5_K, as quantize_row_q4_K_ref does (get_scale_min_k4 unpacks them).
func kScales(q []byte, ls, lm *[8]uint8) {
	q = q[:12]
	for j := range 8 {
		if j < 4 {
			q[j] = ls[j]
			q[j+4] = lm[j]
		} else {
			q[j+4] = ls[j]&0xF | (lm[j]&0xF)<<4
			q[j-4] |= (ls[j] >> 4) << 6
			q[j] |= (lm[j] >> 4) << 6
		}
	}
}

// quantizeK45 is the common body of quantize_row_q4_K_ref and
// quantize_row_q5_K_ref: 8 sub-blocks of 32 values, each quantized
// asymmetrically with weights av_x + |x| (p: the type's levels and search),
// then scales and minimums to 6 bits. It writes d, dmin and the scales into
// the block's first 16 bytes and returns the levels in L.
func quantizeK45(y []byte, xb []float32, L *[QK_K]uint8, p *qkx2) {
	var (
		x, w           groups
		lt             [32][8]uint8
		scales, minima [8]float32
	)
	x.load(xb, 32)
	k45Weights(&x, &w)
	p.run(&x, &w, &lt, &scales, &minima)
	maxScale, maxMin := maxima(scales[:], minima[:])
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := range 8 {
		ls[j] = min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm[j] = min(63, uint8(nearestInt(float32(invMin*minima[j]))))
	}
	kScales(y[4:16], &ls, &lm)
	k45Levels(y, xb, L, &lt, maxScale/63, maxMin/63, p.nmax)
}

// quantizeQ4_K is quantize_row_q4_K_ref: 144-byte blocks of d and dmin as
// half, scales[12], qs[128] (levels l and l+32 of each 64 in one byte).
func quantizeQ4_K(dst []byte, src []float32) {
	var L [QK_K]uint8
	for bi := 0; bi*QK_K < len(src); bi++ {
		y := dst[bi*144 : bi*144+144]
		quantizeK45(y, src[bi*QK_K:bi*QK_K+QK_K], &L, &qkx2Q4)
		packQ4_K(y[16:144], &L)
	}
}

// quantizeQ5_K is quantize_row_q5_K_ref: 176-byte blocks of d and dmin as
// half, scales[12], qh[32] (the fifth bits), qs[128] (the low four).
func quantizeQ5_K(dst []byte, src []float32) {
	var L [QK_K]uint8
	for bi := 0; bi*QK_K < len(src); bi++ {
		y := dst[bi*176 : bi*176+176]
		quantizeK45(y, src[bi*QK_K:bi*QK_K+QK_K], &L, &qkx2Q5)
		packQ5_K(y[16:48], y[48:176], &L)
	}
}

// quantizeQ6_K is quantize_row_q6_K_ref: 210-byte blocks of ql[128] (low
// four bits of each level), qh[64] (high two), scales int8[16] and d as
// half.
func quantizeQ6_K(dst []byte, src []float32) {
	var (
		L      [QK_K]int8
		scales [16]float32
		x      groups
		lazy   q6Lazy
	)
	for bi := 0; bi*QK_K < len(src); bi++ {
		xb := src[bi*QK_K : bi*QK_K+QK_K]
		y := dst[bi*210 : bi*210+210]
		for h := range 2 {
			x.load(xb[128*h:], 16)
			symSearch(&x, &lazy.lv[h], &lazy.amax[h], (*[8]float32)(scales[8*h:]), false)
		}
		q6Block(y, xb, &L, &scales, &lazy)
	}
}

// q6Lazy is what make_qx_quants left for the 16 groups of a Q6_K block:
// the levels of group j = 8h+k are lv[h][·][k]. q6Block recomputes the
// levels of a group from its quantized scale, and reads these only where
// that scale is 0, so they are laid out as a block holds them only then.
type q6Lazy struct {
	lv   [2][32][8]int32
	amax [2][8]float32
}
