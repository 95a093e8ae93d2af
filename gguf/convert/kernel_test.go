package convert

import (
	"encoding/binary"
	"testing"

	"github.com/ferry-llm/ferry/tensor"
)

// The direct BF16 → F16 kernel equals the float32 path (BF16ToF32 then the
// RNE F32ToF16) for every one of the 65536 bfloat16 patterns, aligned and
// not.
func TestBF16ToF16Kernel(t *testing.T) {
	src := make([]byte, 2<<16+1)
	for i := 0; i < 1<<16; i++ {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	f := make([]float32, 1<<16)
	tensor.BF16ToF32(f, src[:2<<16])
	want := make([]byte, 2<<16)
	tensor.F32ToF16(want, f)
	for _, off := range []int{0, 1} {
		s := append([]byte(nil), src[:2<<16]...)
		if off == 1 { // odd address: the portable loop
			s = append(make([]byte, 1, 2<<16+1), s...)[1:]
		}
		got := make([]byte, 2<<16)
		bf16ToF16(got, s)
		for i := 0; i < 1<<16; i++ {
			g, w := binary.LittleEndian.Uint16(got[2*i:]), binary.LittleEndian.Uint16(want[2*i:])
			if g != w && !(isNaN16(g) && isNaN16(w)) {
				t.Fatalf("offset %d: bf16 %#04x → %#04x, float32 path %#04x", off, i, g, w)
			}
		}
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

func isNaN16(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }

func BenchmarkBF16ToF16(b *testing.B) {
	src := make([]byte, 1<<20)
	dst := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(src)))
	for i := 0; i < b.N; i++ {
		bf16ToF16(dst, src)
	}
}
