package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
)

// Scalar conversions. All rounding is round-to-nearest-even, as torch's
// `.to(bfloat16)` / `.to(float16)` and numpy's astype do.

// BF16ToFloat32 widens a bfloat16 bit pattern; this is exact.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToBF16 rounds f to bfloat16 (RNE). NaN becomes the canonical quiet
// NaN 0x7FC0, as c10::BFloat16 does; ±Inf and overflow give ±Inf.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return 0x7fc0
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float32ToF16 rounds f to IEEE binary16 (RNE), with subnormals, overflow to
// ±Inf, and NaN kept as a quiet NaN of the same sign.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign // below half the smallest subnormal: rounds to zero
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		h := mant >> shift
		rem := mant & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || (rem == halfway && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is the right answer, up to Inf
	}
	return sign | uint16(h)
}

// RoundTo rounds f to dtype d (RNE) and widens it back: the value a
// d-typed operation leaves. F32 and other dtypes leave f as it is.
func RoundTo(d DType, f float32) float32 {
	switch d {
	case BF16:
		return BF16ToFloat32(Float32ToBF16(f))
	case F16:
		return F16ToFloat32(Float32ToF16(f))
	}
	return f
}

// F16ToFloat32 widens an IEEE binary16 bit pattern; this is exact.
func F16ToFloat32(h uint16) float32 { return f16Table()[h] }

func f16ToFloat32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// subnormal: normalise
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

var f16Table = sync.OnceValue(func() *[65536]float32 {
	var t [65536]float32
	for i := range t {
		t[i] = f16ToFloat32Slow(uint16(i))
	}
	return &t
})

// Buffer conversions. Byte buffers are little-endian, as in safetensors and
// GGUF. The caller sizes dst to match src; a mismatch panics like copy
// would silently truncate, because it is a programming error.

func checkLen(what string, bytes, elems, width int) {
	if bytes != elems*width {
		panic(fmt.Sprintf("tensor.%s: %d bytes for %d elements of width %d", what, bytes, elems, width))
	}
}

// BF16ToF32 widens little-endian bfloat16 values in src into dst.
func BF16ToF32(dst []float32, src []byte) {
	checkLen("BF16ToF32", len(src), len(dst), 2)
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// F32ToBF16 rounds src to bfloat16 (RNE) into dst.
func F32ToBF16(dst []byte, src []float32) {
	checkLen("F32ToBF16", len(dst), len(src), 2)
	if len(src) == 0 {
		return
	}
	_ = dst[2*len(src)-1]
	for i, f := range src {
		h := Float32ToBF16(f)
		dst[2*i] = byte(h)
		dst[2*i+1] = byte(h >> 8)
	}
}

// F16ToF32 widens little-endian binary16 values in src into dst.
func F16ToF32(dst []float32, src []byte) {
	checkLen("F16ToF32", len(src), len(dst), 2)
	t := f16Table()
	for i := range dst {
		dst[i] = t[binary.LittleEndian.Uint16(src[2*i:])]
	}
}

// F32ToF16 rounds src to binary16 (RNE) into dst.
//
// Inputs whose magnitude is in [2^-14, 65536) — normal F16 results, plus
// the values that round up to Inf — take a branch-free path: rebias the
// exponent by subtracting (127-15)<<23 and round to nearest even by adding
// 0xfff plus the lowest kept bit before shifting; a carry out of the
// mantissa lands in the exponent, which is the right answer up to Inf.
// Everything else (zeros, subnormals, overflow, Inf, NaN) goes through
// Float32ToF16.
func F32ToF16(dst []byte, src []float32) {
	checkLen("F32ToF16", len(dst), len(src), 2)
	if len(src) == 0 {
		return
	}
	_ = dst[2*len(src)-1]
	for i, f := range src {
		b := math.Float32bits(f)
		x := b & 0x7fffffff
		var h uint32
		if x-0x38800000 < 0x47800000-0x38800000 {
			h = (x - 0x38000000 + 0xfff + (x>>13)&1) >> 13
			h |= (b >> 16) & 0x8000
		} else {
			h = uint32(Float32ToF16(f))
		}
		dst[2*i] = byte(h)
		dst[2*i+1] = byte(h >> 8)
	}
}

// BytesToF32 decodes little-endian float32 values.
func BytesToF32(dst []float32, src []byte) {
	checkLen("BytesToF32", len(src), len(dst), 4)
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// F32ToBytes encodes float32 values little-endian.
func F32ToBytes(dst []byte, src []float32) {
	checkLen("F32ToBytes", len(dst), len(src), 4)
	for i, f := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
	}
}

// ToF32 decodes src, holding elements of d, into dst.
func ToF32(d DType, dst []float32, src []byte) error {
	switch d {
	case BF16:
		BF16ToF32(dst, src)
	case F16:
		F16ToF32(dst, src)
	case F32:
		BytesToF32(dst, src)
	case F64:
		checkLen("ToF32", len(src), len(dst), 8)
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	default:
		return fmt.Errorf("no float32 conversion from %s", d)
	}
	return nil
}

// FromF32 encodes src as elements of d into dst, rounding once (RNE).
func FromF32(d DType, dst []byte, src []float32) error {
	switch d {
	case BF16:
		F32ToBF16(dst, src)
	case F16:
		F32ToF16(dst, src)
	case F32:
		F32ToBytes(dst, src)
	case F64:
		checkLen("FromF32", len(dst), len(src), 8)
		for i, f := range src {
			binary.LittleEndian.PutUint64(dst[8*i:], math.Float64bits(float64(f)))
		}
	default:
		return fmt.Errorf("no float32 conversion to %s", d)
	}
	return nil
}
