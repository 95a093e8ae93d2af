package quant

import (
	"encoding/binary"
	"math"

	"github.com/ferry-llm/ferry/tensor"
)

// The legacy 32-value block quantizers, quantize_row_q{4,5}_{0,1}_ref of
// ggml-quants.c at llama.cpp 34af94c. llama-quantize falls back to them when
// a row is not a whole number of 256-value K-quant blocks (llamacpp.md
// §3.6). Every product is rounded to float32 on its own before it is added
// to (the explicit float32 conversions keep the compiler from fusing the
// two into an FMA on arm64), so the bytes are the same on every platform.

// cByte is the low byte of a C float-to-integer conversion as gcc compiles
// it for x86-64 (cvttss2si): truncation toward zero, and for NaN or a
// value outside int32 the "integer indefinite" 0x80000000, whose low byte
// is 0. C leaves out-of-range conversions undefined; this is what
// llama-quantize does on x86-64, where a block whose largest magnitude is
// subnormal gets an infinite inverse scale. Go's own conversion of such a
// value differs between amd64 and arm64 (arm64 saturates).
func cByte(f float32) uint8 {
	if f >= -2147483648 && f < 2147483648 {
		return uint8(int32(f))
	}
	return 0
}

func abs32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }

// signedMax is the value of largest magnitude in x, the first of equals
// (q4_0 and q5_0 scale by it, sign kept), and that magnitude. NaN never
// wins: amax < NaN is false.
func signedMax(x []float32) (max, amax float32) {
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, max = a, v
		}
	}
	return max, amax
}

// minMax is the least and greatest value in x, from FLT_MAX and -FLT_MAX
// (q4_1 and q5_1); NaN is never taken.
func minMax(x []float32) (min, max float32) {
	min, max = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < min {
			min = v
		}
		if v > max {
			max = v
		}
	}
	return min, max
}

// inverse is 1/d, or 0 when d is 0 (C's d ? 1.0f/d : 0.0f: NaN is true).
func inverse(d float32) float32 {
	if d != 0 {
		return 1 / d
	}
	return 0
}

// clampTop is C's (uint8_t)MIN(top, (int8_t)v): the int8 compares as an
// int, and a negative one wraps into the byte.
func clampTop(top int, b uint8) uint8 { return uint8(min(top, int(int8(b)))) }

// legacy is one of the four 32-value block types.
//
// Symmetric types (q4_0, q5_0, n = 8 or 16): d = max/-n with max the
// signed value of largest magnitude, q = MIN(2n-1, (int8_t)(x/d + n + 0.5)),
// x = (q-n)·d. Affine types (q4_1, q5_1): d = (max-min)/(2^bits - 1), m =
// min, q = (x-min)/d + 0.5 converted to a byte (q4_1 clamps it to 15
// through int8, q5_1 does not clamp), x = q·d + m.
//
// Layout: a half d (and a half m for the affine types), the fifth bits of
// the 5-bit types as a little-endian uint32 (bit j for value j), then 16
// bytes of low nibbles: value j in byte j's low nibble, value j+16 in its
// high nibble. The 4-bit types OR whole quants in, as C does (they never
// exceed 15 there); the 5-bit ones mask them.
type legacy struct {
	bits   int // 4 or 5
	affine bool
}

var (
	q4_0 = legacy{4, false}
	q4_1 = legacy{4, true}
	q5_0 = legacy{5, false}
	q5_1 = legacy{5, true}
)

// offsets: the block's size in bytes, where its fifth bits start (0: none)
// and where its nibbles start.
func (l legacy) offsets() (size, qhAt, qsAt int) {
	qsAt = 2
	if l.affine {
		qsAt += 2
	}
	if l.bits == 5 {
		qhAt = qsAt
		qsAt += 4
	}
	return qsAt + 16, qhAt, qsAt
}

func (l legacy) encode(dst []byte, src []float32) {
	size, _, _ := l.offsets()
	levels := float32(int(1)<<l.bits - 1)
	var q [32]uint8
	for bi := 0; bi*32 < len(src); bi++ {
		x := src[bi*32 : bi*32+32]
		out := dst[bi*size : bi*size+size]
		if l.affine {
			d, m := affine(&q, x, levels, l.bits == 4)
			putHalf(out, d)
			putHalf(out[2:], m)
		} else {
			putHalf(out, symmetric(&q, x, (levels+1)/2))
		}
		l.pack(out, &q)
	}
}

// pack stores a block's 32 quants into out, after its d (and m): the fifth
// bits, then the nibbles.
func (l legacy) pack(out []byte, q *[32]uint8) {
	_, qhAt, qsAt := l.offsets()
	mask := uint8(0xFF)
	if l.bits == 5 {
		mask = 0x0F
	}
	if qhAt > 0 {
		var h uint32
		for j, v := range q {
			h |= uint32(v&0x10) >> 4 << j
		}
		binary.LittleEndian.PutUint32(out[qhAt:], h)
	}
	for j := range 16 {
		out[qsAt+j] = q[j]&mask | (q[j+16]&mask)<<4
	}
}

func symmetric(q *[32]uint8, x []float32, n float32) (d float32) {
	max, _ := signedMax(x)
	d = max / -n
	id := inverse(d)
	top := int(2*n - 1)
	for j, v := range x {
		q[j] = clampTop(top, cByte(float32(v*id)+(n+0.5)))
	}
	return d
}

func affine(q *[32]uint8, x []float32, levels float32, clamp bool) (d, min float32) {
	min, max := minMax(x)
	d = (max - min) / levels
	id := inverse(d)
	for j, v := range x {
		q[j] = cByte(float32((v-min)*id) + 0.5)
		if clamp {
			q[j] = clampTop(int(levels), q[j])
		}
	}
	return d, min
}

func putHalf(b []byte, f float32) { binary.LittleEndian.PutUint16(b, tensor.Float32ToF16(f)) }

// decode is dequantize_row_q{4,5}_{0,1}. The product is rounded before m
// is added (no FMA).
func (l legacy) decode(dst []float32, src []byte) {
	size, qhAt, qsAt := l.offsets()
	n := 1 << (l.bits - 1)
	var q [32]int
	for bi := 0; bi*32 < len(dst); bi++ {
		b := src[bi*size : bi*size+size]
		y := dst[bi*32 : bi*32+32]
		var h uint32
		if qhAt > 0 {
			h = binary.LittleEndian.Uint32(b[qhAt:])
		}
		for j, v := range b[qsAt : qsAt+16] {
			q[j] = int(v&0x0F) | int(h>>j<<4&0x10)
			q[j+16] = int(v>>4) | int(h>>(j+12)&0x10)
		}
		d := half(b)
		if !l.affine {
			for j, v := range q {
				y[j] = float32(v-n) * d
			}
			continue
		}
		m := half(b[2:])
		for j, v := range q {
			y[j] = float32(float32(v)*d) + m
		}
	}
}
