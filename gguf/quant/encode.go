package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ferry-llm/ferry/tensor"
)

// ErrNoEncoder is returned for a type ferry cannot yet encode into.
var ErrNoEncoder = errors.New("no encoder")

// CanEncode reports whether Encode handles t: whether its row has an
// encoder.
func (t Type) CanEncode() bool { return t.row().Encode != nil }

// Encode writes src, a whole number of t's blocks, into dst as type t.
// dst must hold len(src)/BlockSize blocks of TypeSize bytes.
func Encode(t Type, dst []byte, src []float32) error {
	r := t.row()
	if r.Encode == nil {
		return fmt.Errorf("%w for %s", ErrNoEncoder, t)
	}
	if _, err := r.blockBytes(len(src), len(dst)); err != nil {
		return err
	}
	r.Encode(dst, src)
	return nil
}

// blockBytes is the size of n values of r's type, checking that they are whole
// blocks and that a buffer of have bytes holds them.
func (r *Traits) blockBytes(n, have int) (int, error) {
	bs := r.BlockSize
	if int64(n)%bs != 0 {
		return 0, fmt.Errorf("%s: %d values are not a whole number of %d-value blocks", r.Name, n, bs)
	}
	need := int64(n) / bs * r.TypeSize
	if int64(have) < need {
		return 0, fmt.Errorf("%s: %d values need %d bytes, have %d", r.Name, n, need, have)
	}
	return int(need), nil
}

// quantizeQ8_0 is quantize_row_q8_0_ref (and gguf-py's bit-exact Q8_0):
// per block of 32, d = max|x|/127 in float32, id = 1/d (0 when d is 0),
// q = round-half-away-from-zero(x·id), d stored as IEEE half (RNE).
// Every product is rounded to float32 on its own (the explicit float32
// conversions keep the compiler from fusing into an FMA on arm64), so the
// bytes are the same on every platform.
//
// The maximum is C's MAX(amax, |x|), which takes a NaN and drops it again
// at the next value, and the float-to-int8 store is x86-64's (cByte), so
// a block whose largest magnitude is subnormal (an infinite id) gets
// llama-quantize's bytes on arm64 too.
func quantizeQ8_0(dst []byte, src []float32) {
	for bi := 0; bi*32 < len(src); bi++ {
		x := src[bi*32 : bi*32+32]
		out := dst[bi*34 : bi*34+34]
		var amax float32
		for _, v := range x {
			if a := abs32(v); !(amax > a) {
				amax = a
			}
		}
		d := amax / 127
		id := inverse(d)
		binary.LittleEndian.PutUint16(out, tensor.Float32ToF16(d))
		for k, v := range x {
			q := float32(v * id)
			out[2+k] = cByte(float32(math.Round(float64(q))))
		}
	}
}
