package convert

import (
	"encoding/binary"
	"sync"
	"unsafe"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// bf16ToF16Table maps every bfloat16 bit pattern to the IEEE half that
// round-to-nearest-even of its float32 value gives (what numpy's
// astype(float16) does to the widened value). Built once from the exact
// scalar conversion, 128 KiB.
var bf16ToF16Table = sync.OnceValue(func() *[1 << 16]uint16 {
	var t [1 << 16]uint16
	for i := range t {
		t[i] = tensor.Float32ToF16(tensor.BF16ToFloat32(uint16(i)))
	}
	return &t
})

// forceTable makes bf16ToF16 use the table alone (tests compare the
// vector kernel against it).
var forceTable bool

// littleEndian is whether the host stores uint16 as the files do.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// bf16ToF16 converts little-endian bfloat16 src into little-endian half dst
// (len(dst) ≥ len(src), both even) and returns how many source values were
// NaN or ±Inf (counted while converting: the vector kernel does it in two
// instructions per 16 values). dst may be src itself (in place).
func bf16ToF16(dst, src []byte) int64 {
	t := bf16ToF16Table()
	n := len(src) / 2
	if littleEndian && n > 0 && uintptr(unsafe.Pointer(&src[0]))%2 == 0 && uintptr(unsafe.Pointer(&dst[0]))%2 == 0 {
		s := unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), n)
		d := unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), n)
		k, nonFinite := bf16ToF16Fast(d, s)
		for i, x := range s[k:] {
			if x&0x7f80 == 0x7f80 {
				nonFinite++
			}
			d[k+i] = t[x]
		}
		return nonFinite
	}
	dst = dst[:len(src)]
	var nonFinite int64
	for i := 0; i+1 < len(src); i += 2 {
		x := binary.LittleEndian.Uint16(src[i:])
		if x&0x7f80 == 0x7f80 {
			nonFinite++
		}
		h := t[x]
		dst[i] = byte(h)
		dst[i+1] = byte(h >> 8)
	}
	return nonFinite
}

// directKernel reports whether tensor bytes can go from source to output
// without the float32 stage (no element op, and a conversion that keeps
// the element width: a copy or the bfloat16 → half kernel), and the
// function doing it (nil: a plain copy), which returns the count of source
// values that are NaN or ±Inf. Row gathers and column
// permutations move whole elements and commute with the conversion.
func directKernel(t *TensorPlan) (ok bool, conv func(dst, src []byte) int64) {
	v := t.vt
	if len(v.ops) > 0 || len(v.srcs) == 0 {
		return false, nil
	}
	dt := v.srcs[0].DType
	for _, s := range v.srcs[1:] {
		if s.DType != dt {
			return false, nil
		}
	}
	switch {
	case dt == tensor.BF16 && t.Type == quant.F16:
		return true, bf16ToF16
	case dt == tensor.BF16 && t.Type == quant.BF16,
		dt == tensor.F16 && t.Type == quant.F16,
		dt == tensor.F32 && t.Type == quant.F32:
		return true, nil
	}
	return false, nil
}
