package quant

import (
	"math"
	"testing"
)

func TestValidate(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ramp := func(n int, at int, v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%17) - 8
		}
		if at >= 0 {
			x[at] = v
		}
		return x
	}
	for _, tt := range []struct {
		typ   Type
		x     []float32
		bad   bool
		block int
		field string
	}{
		{Q8_0, ramp(64, -1, 0), false, 0, ""},
		{Q8_0, ramp(64, 40, inf), true, 1, "d"},
		{Q8_0, ramp(64, 3, nan), false, 0, ""}, // C's MAX drops a NaN at the next value: d stays finite
		{Q8_0, ramp(64, 63, nan), true, 1, "d"},
		{Q4_K, ramp(512, 300, inf), true, 1, "d"},
		{Q4_0, ramp(64, -1, 0), false, 0, ""},
		{Q4_1, ramp(64, 0, inf), true, 0, "d"},
		{F16, ramp(8, 5, 1e6), true, 5, "x"}, // overflows half
		{F16, ramp(8, -1, 0), false, 0, ""},
		{BF16, ramp(8, 2, nan), true, 2, "x"},
	} {
		out := make([]byte, int64(len(tt.x))/tt.typ.BlockSize()*tt.typ.TypeSize())
		if err := Encode(tt.typ, out, tt.x); err != nil {
			t.Fatal(err)
		}
		nf, bad := Validate(tt.typ, out)
		if bad != tt.bad || (bad && (nf.Block != tt.block || nf.Field != tt.field)) {
			t.Errorf("%s: Validate = %+v %v, want block %d field %q %v", tt.typ, nf, bad, tt.block, tt.field, tt.bad)
		}
	}
}
