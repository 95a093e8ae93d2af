package convert

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/ferry-llm/ferry/tensor"
)

// The direct BF16 → F16 kernel gives, bit for bit, what the float32 path
// (exact widening, then the RNE Float32ToF16, NaN → sign|0x7e00) gives for
// every one of the 65536 bfloat16 patterns: through the vector kernel and
// the table alone, at aligned and odd addresses, with and without a tail
// shorter than a vector block.
func TestBF16ToF16Kernel(t *testing.T) {
	src := make([]byte, 2<<16)
	want := make([]uint16, 1<<16)
	for i := range want {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
		want[i] = tensor.Float32ToF16(tensor.BF16ToFloat32(uint16(i)))
	}
	for _, tc := range []struct {
		name  string
		table bool
		odd   bool
		n     int
	}{
		{"vector", false, false, 1 << 16},
		{"vector-tail", false, false, 1<<16 - 5},
		{"vector-short", false, false, 15},
		{"table", true, false, 1 << 16},
		{"odd-address", false, true, 1 << 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forceTable = tc.table
			defer func() { forceTable = false }()
			s := append([]byte(nil), src[:2*tc.n]...)
			if tc.odd { // odd address: the portable loop
				s = append(make([]byte, 1, 2*tc.n+1), s...)[1:]
			}
			got := make([]byte, 2*tc.n)
			nonFinite := bf16ToF16(got, s)
			var wantNonFinite int64
			for i := 0; i < tc.n; i++ {
				if g := binary.LittleEndian.Uint16(got[2*i:]); g != want[i] {
					t.Fatalf("bf16 %#04x → %#04x, float32 path %#04x", i, g, want[i])
				}
				if f := tensor.BF16ToFloat32(uint16(i)); math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
					wantNonFinite++
				}
			}
			if nonFinite != wantNonFinite {
				t.Errorf("counted %d NaN/Inf sources, want %d", nonFinite, wantNonFinite)
			}
		})
	}
}

// The count stays exact past one kernel call's lane capacity (65535 per
// lane): a buffer of NaN and Inf only, longer than kernelMax.
func TestBF16ToF16CountsLongRuns(t *testing.T) {
	n := 16*65536 + 21
	src := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(src[2*i:], []uint16{0x7fc0, 0xff80, 0x7f80, 0xffff}[i%4])
	}
	if got := bf16ToF16(src, src); got != int64(n) {
		t.Errorf("counted %d NaN/Inf of %d", got, n)
	}
}

func TestBF16ToF16InPlace(t *testing.T) {
	src := make([]byte, 2<<16)
	for i := 0; i < 1<<16; i++ {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	want := make([]byte, len(src))
	bf16ToF16(want, src)
	bf16ToF16(src, src)
	for i := range src {
		if src[i] != want[i] {
			t.Fatalf("in-place conversion differs at byte %d", i)
		}
	}
}

// BenchmarkBF16ToF16 is the direct kernel, vector (AVX2/F16C where the
// CPU has it) and table alone.
func BenchmarkBF16ToF16(b *testing.B) {
	src := make([]byte, 1<<20)
	dst := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, table := range []bool{false, true} {
		name := "vector"
		if table {
			name = "table"
		}
		b.Run(name, func(b *testing.B) {
			forceTable = table
			defer func() { forceTable = false }()
			b.SetBytes(int64(len(src)))
			for i := 0; i < b.N; i++ {
				bf16ToF16(dst, src)
			}
		})
	}
}

// gatherCols moves whole elements: for 2-, 4- and 3-byte elements and
// several rows, dst[row][c] = src[row][perm[c]].
func TestGatherCols(t *testing.T) {
	perm := []int64{3, 0, 4, 1, 2}
	for _, es := range []int{2, 4, 3} {
		t.Run(fmt.Sprint(es), func(t *testing.T) {
			const rows = 3
			C := len(perm)
			src := make([]byte, rows*C*es)
			for i := range src {
				src[i] = byte(i*31 + 7)
			}
			dst := make([]byte, len(src))
			gatherCols(dst, src, perm, es)
			for r := 0; r < rows; r++ {
				for c, pc := range perm {
					got := dst[(r*C+c)*es : (r*C+c+1)*es]
					want := src[(r*C+int(pc))*es : (r*C+int(pc)+1)*es]
					if !bytes.Equal(got, want) {
						t.Fatalf("row %d column %d: %x, want source column %d %x", r, c, got, pc, want)
					}
				}
			}
		})
	}
}
