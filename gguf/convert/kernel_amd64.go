package convert

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveF16C selects the AVX2/F16C bfloat16 → half kernel; without it the
// table gives the same bits, slower.
var haveF16C = cpu.X86.HasAVX2 && cpu.X86.HasF16C

// bf16ToF16AVX2 converts n bfloat16 values at src into halves at dst, n a
// multiple of 16: widen to float32 (exact), VCVTPS2PH with round to
// nearest even, and every NaN replaced by sign|0x7e00 as
// tensor.Float32ToF16 writes it (the hardware keeps payload bits).
//
//go:noescape
func bf16ToF16AVX2(dst, src *uint16, n int)

// bf16ToF16Fast converts the longest multiple-of-16 prefix of s into d and
// returns its length (0 when the CPU lacks AVX2/F16C).
func bf16ToF16Fast(d, s []uint16) int {
	if !haveF16C || forceTable {
		return 0
	}
	n := len(s) &^ 15
	if n == 0 {
		return 0
	}
	_ = d[n-1]
	bf16ToF16AVX2(unsafe.SliceData(d), unsafe.SliceData(s), n)
	return n
}
