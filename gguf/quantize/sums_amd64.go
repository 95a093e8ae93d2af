package quantize

import "golang.org/x/sys/cpu"

// useAVX2 selects sumsAVX2; a test turns it off to compare it with the
// portable form.
var useAVX2 = cpu.X86.HasAVX2

// sumLanes is sumLanesGo, by sumsAVX2 where the CPU has AVX2.
func sumLanes(x, y []float32, acc *lanes) {
	if useAVX2 && len(x) > 0 {
		sumsAVX2(&x[0], &y[0], len(x)/4, acc)
		return
	}
	sumLanesGo(x, y, acc)
}

// sumsAVX2 is sumLanesGo over groups groups of four values at x and y.
//
//go:noescape
func sumsAVX2(x, y *float32, groups int, acc *lanes)
