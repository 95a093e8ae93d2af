package tensor

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestNonFinite checks the word-at-a-time scan against a per-element
// decode: every 16-bit pattern at every lane position, and F32/F64.
func TestNonFinite(t *testing.T) {
	for _, tc := range []struct {
		d     DType
		value func(h uint16) float64
	}{
		{BF16, func(h uint16) float64 { return float64(BF16ToFloat32(h)) }},
		{F16, func(h uint16) float64 { return float64(F16ToFloat32(h)) }},
	} {
		// 65536 patterns, each placed at a shifting lane among finite ones
		// (plus an odd tail), so every lane of the fast path sees them.
		raw := make([]byte, 2*(1<<16+3))
		var wantN int64
		wantFirst := int64(-1)
		for i := 0; i < 1<<16+3; i++ {
			h := uint16(0x3c00) // finite in both
			if i < 1<<16 {
				h = uint16(i)
			}
			binary.LittleEndian.PutUint16(raw[2*i:], h)
			if v := tc.value(h); math.IsNaN(v) || math.IsInf(v, 0) {
				if wantFirst < 0 {
					wantFirst = int64(i)
				}
				wantN++
			}
		}
		n, first := NonFinite(tc.d, raw)
		if n != wantN || first != wantFirst {
			t.Errorf("%s: %d non-finite, first %d; want %d, first %d", tc.d, n, first, wantN, wantFirst)
		}
		for _, pos := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8} {
			buf := make([]byte, 2*9)
			for i := 0; i < 9; i++ {
				binary.LittleEndian.PutUint16(buf[2*i:], 0x3c00)
			}
			binary.LittleEndian.PutUint16(buf[2*pos:], 0xffff) // NaN in both
			if n, first := NonFinite(tc.d, buf); n != 1 || first != int64(pos) {
				t.Errorf("%s: NaN at %d: got %d at %d", tc.d, pos, n, first)
			}
		}
	}
	f32 := make([]byte, 4*5)
	for i, v := range []float32{1, float32(math.Inf(-1)), 0, float32(math.NaN()), math.MaxFloat32} {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
	}
	if n, first := NonFinite(F32, f32); n != 2 || first != 1 {
		t.Errorf("F32: %d at %d, want 2 at 1", n, first)
	}
	f64 := make([]byte, 8*3)
	for i, v := range []float64{math.MaxFloat64, 2, math.Inf(1)} {
		binary.LittleEndian.PutUint64(f64[8*i:], math.Float64bits(v))
	}
	if n, first := NonFinite(F64, f64); n != 1 || first != 2 {
		t.Errorf("F64: %d at %d, want 1 at 2", n, first)
	}
	if n, first := NonFinite(I16, []byte{0xff, 0xff}); n != 0 || first != -1 {
		t.Errorf("I16: %d at %d, want none", n, first)
	}
}

func BenchmarkNonFiniteBF16(b *testing.B) {
	raw := make([]byte, 1<<24)
	for i := 0; i < len(raw); i += 2 {
		binary.LittleEndian.PutUint16(raw[i:], uint16(i)&0x3fff)
	}
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		NonFinite(BF16, raw)
	}
}
