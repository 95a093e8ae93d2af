package merge

import "golang.org/x/sys/cpu"

// haveFMA selects the AVX2/FMA3 tiles; without them the pure-Go kernel
// computes the same bits, slower.
var haveFMA = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func tile4x16(d *float32, dstride int, l *float32, r int, rm *float32, rstride int, nblk int)

//go:noescape
func tile1x16(d *float32, l *float32, r int, rm *float32, rstride int, nblk int)

// lowRankFast computes the columns [0, cols−cols%16) of every row with the
// assembly tiles and returns how many columns it covered (0 if it cannot).
func lowRankFast(d, L, R []float32, n, r, cols int) int {
	if !haveFMA || forceGo || r == 0 {
		return 0
	}
	nblk := cols / 16
	if nblk == 0 {
		return 0
	}
	_ = d[n*cols-1]
	_ = L[n*r-1]
	_ = R[r*cols-1]
	i := 0
	for ; i+4 <= n; i += 4 {
		tile4x16(&d[i*cols], cols, &L[i*r], r, &R[0], cols, nblk)
	}
	for ; i < n; i++ {
		tile1x16(&d[i*cols], &L[i*r], r, &R[0], cols, nblk)
	}
	return nblk * 16
}
