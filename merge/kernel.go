package merge

import (
	"math"
)

// The float32 arithmetic below reproduces what PEFT 0.21 on torch 2.11 (CPU)
// computes, operation for operation, so that rounding the result once gives
// merge_and_unload's bytes. Checked bit for bit against the float32 PEFT
// merges in testdata/reference (see golden_test.go):
//
//   - B·A (MKL sgemm): each element is a chain of fused multiply-adds over
//     the rank in order k = 0…r−1, starting from 0.
//   - ΔW = (B·A)·s, then V = W + ΔW, each one float32 operation.
//   - DoRA row norm (torch.linalg.norm(dim=1), the vectorised last-dim path,
//     AVX2 width): 8 lane accumulators, acc[j mod 8] += v·v as a separate
//     multiply and add, then lanes summed left to right, then the tail
//     sequentially, then a correctly rounded sqrt.
//   - factor = m / norm, W' = factor · V, then one rounding to the output
//     dtype.
//
// Go may fuse x*y+z into an FMA on some architectures (arm64); every
// product that must be rounded on its own is wrapped in an explicit
// float32() conversion, which the spec says prevents fusion.

// fma32 is a*b+c rounded once to float32, as an FMA instruction computes it.
// The product of two float32 is exact in float64; the float64 sum can only
// round wrongly a second time when it lands exactly on a float32 halfway
// point (or in the float32 subnormal range), and then the sum is redone with
// its exact error term (round to odd) so that the float32 rounding is right.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	bits := math.Float64bits(s)
	if bits&0x1fffffff != 0x10000000 && (bits>>52)&0x7ff > 0x380 {
		return float32(s)
	}
	return fma32Slow(p, float64(c), s)
}

func fma32Slow(p, c, s float64) float32 {
	// TwoSum: s + e == p + c exactly.
	bb := s - p
	e := (p - (s - bb)) + (c - bb)
	if e != 0 {
		bits := math.Float64bits(s)
		if bits&1 == 0 { // round to odd: step toward the exact value
			if (e > 0) == (s > 0) {
				bits++
			} else {
				bits--
			}
			s = math.Float64frombits(bits)
		}
	}
	return float32(s)
}

// lowRank computes d = L·R for n rows: L is n×r (row-major), R is r×cols,
// d is n×cols; each element is the FMA chain over k described above. This
// is the hot loop of a merge: four rows are computed together so each
// element of R is loaded once per four rows.
func lowRank(d, L, R []float32, n, r, cols int) {
	d = d[:n*cols]
	done := lowRankFast(d, L, R, n, r, cols)
	if done == cols {
		return
	}
	// The columns the assembly did not cover (or all of them).
	lowRankGo(d, L, R[done:], n, r, cols, cols-done, done)
}

// forceGo makes lowRank use only the pure-Go kernel (tests compare both).
var forceGo bool

// lowRankGo computes columns [off, off+w) of d (row stride cols) from R
// (row stride cols, already offset to column off).
func lowRankGo(d, L, R []float32, n, r, cols, w, off int) {
	for i := 0; i < n; i++ {
		clear(d[i*cols+off : i*cols+off+w])
	}
	i := 0
	for ; i+4 <= n; i += 4 {
		d0 := d[i*cols+off : i*cols+off+w]
		d1 := d[(i+1)*cols+off : (i+1)*cols+off+w]
		d2 := d[(i+2)*cols+off : (i+2)*cols+off+w]
		d3 := d[(i+3)*cols+off : (i+3)*cols+off+w]
		for k := 0; k < r; k++ {
			l0 := float64(L[i*r+k])
			l1 := float64(L[(i+1)*r+k])
			l2 := float64(L[(i+2)*r+k])
			l3 := float64(L[(i+3)*r+k])
			rk := R[k*cols : k*cols+w]
			d0, d1, d2, d3 := d0[:len(rk)], d1[:len(rk)], d2[:len(rk)], d3[:len(rk)]
			for j, rv := range rk {
				x := float64(rv)
				p0, p1, p2, p3 := l0*x, l1*x, l2*x, l3*x
				s0 := p0 + float64(d0[j])
				s1 := p1 + float64(d1[j])
				s2 := p2 + float64(d2[j])
				s3 := p3 + float64(d3[j])
				// One test for the rare cases that need the exact error
				// term (see fma32); otherwise the float32 conversion is
				// the single correct rounding.
				if needsFix(s0) || needsFix(s1) || needsFix(s2) || needsFix(s3) {
					s0 = float64(fma32Slow(p0, float64(d0[j]), s0))
					s1 = float64(fma32Slow(p1, float64(d1[j]), s1))
					s2 = float64(fma32Slow(p2, float64(d2[j]), s2))
					s3 = float64(fma32Slow(p3, float64(d3[j]), s3))
				}
				d0[j], d1[j], d2[j], d3[j] = float32(s0), float32(s1), float32(s2), float32(s3)
			}
		}
	}
	for ; i < n; i++ {
		di := d[i*cols+off : i*cols+off+w]
		for k := 0; k < r; k++ {
			l := float64(L[i*r+k])
			rk := R[k*cols : k*cols+w]
			di := di[:len(rk)]
			for j, rv := range rk {
				di[j] = fmaF(l*float64(rv), di[j])
			}
		}
	}
}

// needsFix reports a float64 sum whose rounding to float32 could differ
// from a single rounding of the exact sum: it sits exactly halfway between
// two float32 values, or below the float32 normal range.
func needsFix(s float64) bool {
	b := math.Float64bits(s)
	return b&0x1fffffff == 0x10000000 || (b>>52)&0x7ff <= 0x380
}

// fmaF adds c to the exact product p (a float32 × float32 in float64) and
// rounds once to float32.
func fmaF(p float64, c float32) float32 {
	s := p + float64(c)
	bits := math.Float64bits(s)
	if bits&0x1fffffff != 0x10000000 && (bits>>52)&0x7ff > 0x380 {
		return float32(s)
	}
	return fma32Slow(p, float64(c), s)
}

// addScaled sets v[j] = w[j] + (d[j]·s), two float32 roundings, as PEFT's
// ΔW = (B@A)·s followed by W + ΔW.
func addScaled(v, w, d []float32, s float32) {
	d = d[:len(v)]
	w = w[:len(v)]
	for j := range v {
		v[j] = w[j] + float32(d[j]*s)
	}
}

// normLanes is torch's vector width for the last-dim norm reduction on the
// reference machine (AVX2 dispatch: 8 float32 lanes).
const normLanes = 8

// rowNorm is torch.linalg.norm(v) over a contiguous row, in float32, with
// torch's vectorised accumulation order.
func rowNorm(v []float32) float32 {
	var acc [normLanes]float32
	n := len(v) - len(v)%normLanes
	for j := 0; j < n; j += normLanes {
		x := v[j : j+normLanes : j+normLanes]
		acc[0] = acc[0] + float32(x[0]*x[0])
		acc[1] = acc[1] + float32(x[1]*x[1])
		acc[2] = acc[2] + float32(x[2]*x[2])
		acc[3] = acc[3] + float32(x[3]*x[3])
		acc[4] = acc[4] + float32(x[4]*x[4])
		acc[5] = acc[5] + float32(x[5]*x[5])
		acc[6] = acc[6] + float32(x[6]*x[6])
		acc[7] = acc[7] + float32(x[7]*x[7])
	}
	sum := acc[0]
	for l := 1; l < normLanes; l++ {
		sum = sum + acc[l]
	}
	for _, x := range v[n:] {
		sum = sum + float32(x*x)
	}
	return float32(math.Sqrt(float64(sum)))
}

// scaleToBF16 writes bf16(f·v[j]) (one float32 multiply, then RNE to
// bfloat16, NaN to the canonical 0x7FC0 as tensor.Float32ToBF16) into dst,
// little-endian: scaleRow and the conversion fused into one pass.
func scaleToBF16(dst []byte, v []float32, f float32) {
	dst = dst[:2*len(v)]
	for j, x := range v {
		b := math.Float32bits(f * x)
		var h uint16
		if b&0x7fffffff > 0x7f800000 {
			h = 0x7fc0
		} else {
			h = uint16((b + 0x7fff + (b>>16)&1) >> 16)
		}
		dst[2*j] = byte(h)
		dst[2*j+1] = byte(h >> 8)
	}
}

// scaleRow sets v[j] = f·v[j] in float32.
func scaleRow(v []float32, f float32) {
	for j := range v {
		v[j] = f * v[j]
	}
}
