package convert

import "golang.org/x/sys/cpu"

// haveF16C selects the AVX2/F16C bfloat16 → half kernel; without it the
// table gives the same bits, slower.
var haveF16C = cpu.X86.HasAVX2 && cpu.X86.HasF16C

// bf16ToF16AVX2 converts n bfloat16 values at src into halves at dst, n a
// multiple of 16 and below 16·65536: widen to float32 (exact), VCVTPS2PH
// with round to nearest even, and every NaN replaced by sign|0x7e00 as
// tensor.Float32ToF16 writes it (the hardware keeps payload bits). counts
// receives, per lane, how many source values were NaN or ±Inf.
//
//go:noescape
func bf16ToF16AVX2(dst, src *uint16, n int, counts *[16]uint16)

// kernelMax keeps every lane count of one kernel call below 65536.
const kernelMax = 16 * 65535

// bf16ToF16Fast converts the longest multiple-of-16 prefix of s into d and
// returns its length (0 when the CPU lacks AVX2/F16C) and how many of the
// values converted were NaN or ±Inf.
func bf16ToF16Fast(d, s []uint16) (int, int64) {
	if !haveF16C || forceTable {
		return 0, 0
	}
	n := len(s) &^ 15
	if n == 0 {
		return 0, 0
	}
	_ = d[n-1]
	var nonFinite int64
	var counts [16]uint16
	for k := 0; k < n; k += kernelMax {
		m := min(kernelMax, n-k)
		bf16ToF16AVX2(&d[k], &s[k], m, &counts)
		for _, c := range counts {
			nonFinite += int64(c)
		}
	}
	return n, nonFinite
}
