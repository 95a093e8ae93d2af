package mlxpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ferry-llm/ferry/tensor"
)

// MLX affine quantization, as mx.quantize(w, group_size, bits) computes it
// on MLX's CPU backend (ml-explore/mlx v0.32.1,
// mlx/backend/cpu/quantized.cpp quantize<T,U>; ../shared/notes/mlx.md §3).
// Per group of groupSize consecutive elements of a row, in float32:
//
//	scale = max((max−min)/(2^bits−1), 1e-7), negated unless |min| > |max|
//	edge  = min if |min| > |max| else max
//	q0    = rint(edge/scale); if q0 ≠ 0 { scale = edge/q0; bias = edge } else bias = 0
//	q     = clamp(rint((w−bias)/scale), 0, 2^bits−1)
//
// rint rounds half to even. The codes are computed with the float32 scale and
// bias; only then are scale and bias rounded (to nearest even) to the stored
// dtype. The codes of a row form one LSB-first bit stream (element i at bits
// [i·bits, (i+1)·bits)), stored as little-endian uint32 words; a group fills
// groupSize·bits/32 whole words.
//
// The arithmetic here has no product that feeds a sum, so no platform can
// fuse it into a fused multiply-add; the dequantizer converts its product
// explicitly so that Go never fuses q·scale+bias (arm64 has FMA).

// ErrNotFinite: mx.quantize has no defined result for NaN or ±Inf weights.
var ErrNotFinite = errors.New("weight is NaN or infinite")

// ErrAffineShape: the buffers do not have the sizes the matrix needs.
var ErrAffineShape = errors.New("affine quantization: buffer size does not match the matrix")

const affineEps float32 = 1e-7

// AffineBits lists the bit widths MLX affine quantization supports.
var AffineBits = []int{2, 3, 4, 5, 6, 8}

// AffineGroupSizes lists the group sizes MLX affine quantization supports.
var AffineGroupSizes = []int{32, 64, 128}

// CheckAffine reports whether bits and groupSize are ones mx.quantize
// accepts in affine mode (mlx ops.cpp affine_quantize).
func CheckAffine(bits, groupSize int) error {
	switch bits {
	case 2, 3, 4, 5, 6, 8:
	default:
		return fmt.Errorf("%w: %d (MLX affine supports 2, 3, 4, 5, 6 and 8)", ErrBits, bits)
	}
	switch groupSize {
	case 32, 64, 128:
	default:
		return fmt.Errorf("%w: %d (MLX affine supports 32, 64 and 128)", ErrGroupSize, groupSize)
	}
	return nil
}

// scaleWidth is the byte width of a scale or bias stored as dt.
func scaleWidth(dt tensor.DType) (int, error) {
	switch dt {
	case tensor.BF16, tensor.F16:
		return 2, nil
	case tensor.F32:
		return 4, nil
	}
	return 0, fmt.Errorf("affine quantization: scales and biases cannot be stored as %s (BF16, F16 or F32)", dt)
}

// affineSizes checks the arguments common to quantization and
// dequantization of elems weights and returns the group count and the
// scale width.
func affineSizes(elems, cols, groupSize, bits int, dt tensor.DType, wq, scales, biases []byte) (groups, width int, err error) {
	if err := CheckAffine(bits, groupSize); err != nil {
		return 0, 0, err
	}
	if width, err = scaleWidth(dt); err != nil {
		return 0, 0, err
	}
	if cols <= 0 || cols%groupSize != 0 {
		return 0, 0, fmt.Errorf("%w: the last dimension %d is not a multiple of the group size %d", ErrAffineShape, cols, groupSize)
	}
	if elems%cols != 0 {
		return 0, 0, fmt.Errorf("%w: %d elements are not whole rows of %d", ErrAffineShape, elems, cols)
	}
	groups = elems / groupSize
	if len(wq) != elems*bits/8 || len(scales) != groups*width || len(biases) != groups*width {
		return 0, 0, fmt.Errorf("%w: %d weights at %d bits, group %d need %d, %d and %d bytes; have %d, %d and %d",
			ErrAffineShape, elems, bits, groupSize, elems*bits/8, groups*width, groups*width,
			len(wq), len(scales), len(biases))
	}
	return groups, width, nil
}

// putScale stores v, rounded to dt, at b.
func putScale(b []byte, dt tensor.DType, v float32) {
	switch dt {
	case tensor.BF16:
		binary.LittleEndian.PutUint16(b, tensor.Float32ToBF16(v))
	case tensor.F16:
		binary.LittleEndian.PutUint16(b, tensor.Float32ToF16(v))
	default:
		binary.LittleEndian.PutUint32(b, math.Float32bits(v))
	}
}

// getScale reads a value of dt at b.
func getScale(b []byte, dt tensor.DType) float32 {
	switch dt {
	case tensor.BF16:
		return tensor.BF16ToFloat32(binary.LittleEndian.Uint16(b))
	case tensor.F16:
		return tensor.F16ToFloat32(binary.LittleEndian.Uint16(b))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b))
}

// rint rounds half to even, as C's rint in the default rounding mode.
func rint(x float32) float32 { return float32(math.RoundToEven(float64(x))) }

// AffineQuantize quantizes w, a row-major matrix with cols columns (len(w) a
// multiple of cols), as mx.quantize(w, group_size=groupSize, bits=bits) does
// on the CPU backend. out is the dtype the scales and biases are stored in
// (tensor.BF16 or tensor.F16; tensor.F32 also, as mx.quantize stores them
// for a float32 input). wq receives rows*cols*bits/32 uint32 words
// little-endian (len rows*cols*bits/8 bytes); scales and biases receive
// rows*cols/groupSize values of out, little-endian. It returns an error for
// unsupported bits/group size, cols not a multiple of groupSize, buffers of
// the wrong size, or a NaN or infinite weight (ErrNotFinite, naming the
// element; nothing useful is then in the outputs).
//
// MLX computes from the input promoted to float32, so for a BF16 or F16
// tensor w must hold exactly its values widened to float32 (as
// tensor.BF16ToF32 and tensor.F16ToF32 give): the result is then
// mx.quantize's on that tensor, byte for byte. mlx_lm.convert casts the
// weights to the model dtype before it quantizes, so a weight stored in
// another dtype (an F32 checkpoint, or --dtype f16 over BF16) must first be
// rounded to out (tensor.RoundTo) to give mlx-lm's bytes.
func AffineQuantize(w []float32, cols, groupSize, bits int, out tensor.DType, wq, scales, biases []byte) error {
	groups, width, err := affineSizes(len(w), cols, groupSize, bits, out, wq, scales, biases)
	if err != nil {
		return err
	}
	nBins := float32(int(1)<<bits - 1)
	groupBytes := groupSize * bits / 8
	for g := range groups {
		x := w[g*groupSize : (g+1)*groupSize]
		lo, hi, ok := groupRange(x)
		if !ok {
			for i, v := range x {
				if v-v != 0 { // NaN or ±Inf
					return fmt.Errorf("%w: element %d (row %d, column %d) is %v",
						ErrNotFinite, g*groupSize+i, (g*groupSize+i)/cols, (g*groupSize+i)%cols, v)
				}
			}
		}
		scale, bias := affineParams(lo, hi, nBins)
		packGroup(wq[g*groupBytes:(g+1)*groupBytes], x, scale, bias, nBins, bits)
		putScale(scales[g*width:], out, scale)
		putScale(biases[g*width:], out, bias)
	}
	return nil
}

// affineParams is the float32 scale and bias of a group whose least and
// greatest elements are lo and hi.
func affineParams(lo, hi, nBins float32) (scale, bias float32) {
	side := abs32(lo) > abs32(hi)
	scale = max((hi-lo)/nBins, affineEps)
	edge := hi
	if side {
		edge = lo
	} else {
		scale = -scale
	}
	if q0 := rint(edge / scale); q0 != 0 {
		return edge / q0, edge
	}
	return scale, 0
}

// groupRange is the least and greatest element of x (len(x) > 0), and
// false if an element is NaN or infinite. It works on the bits, without
// branches: an IEEE float's bits, with the magnitude bits flipped where
// the sign is set, order as signed integers as the floats do (-0 just
// below +0; the sign of a zero extreme changes neither the scale nor the
// bias), and a float is finite when its magnitude bits are below the
// infinity's.
func groupRange(x []float32) (lo, hi float32, finite bool) {
	kmin, kmax := int32(math.MaxInt32), int32(math.MinInt32)
	var mag uint32
	for _, v := range x {
		b := math.Float32bits(v)
		mag = max(mag, b&0x7fffffff)
		k := int32(b) ^ (int32(b) >> 31 & 0x7fffffff)
		kmin = min(kmin, k)
		kmax = max(kmax, k)
	}
	unkey := func(k int32) float32 { return math.Float32frombits(uint32(k ^ (k >> 31 & 0x7fffffff))) }
	return unkey(kmin), unkey(kmax), mag < 0x7f800000
}

// rintMagic is 2^23: adding it to 0 ≤ y < 2^23 rounds y to an integer.
const rintMagic float32 = 1 << 23

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// packGroup quantizes one group x into dst (len(x)·bits/8 bytes), LSB first.
func packGroup(dst []byte, x []float32, scale, bias, nBins float32, bits int) {
	var acc uint64
	n, o := 0, 0
	for _, v := range x {
		// clamp(rint(y), 0, nBins) = rint(clamp(y, 0, nBins)) as the bounds
		// are integers; y is never NaN (v and bias are finite, scale is
		// not zero). For 0 ≤ y ≤ 255, y + 2^23 rounds (to nearest even) to
		// 2^23 + rint(y), whose low mantissa bits are that integer.
		y := (v - bias) / scale
		if !(y > 0) {
			y = 0
		}
		if y > nBins {
			y = nBins
		}
		acc |= uint64(math.Float32bits(y+rintMagic)&0x7fffff) << n
		if n += bits; n >= 32 {
			binary.LittleEndian.PutUint32(dst[o:], uint32(acc))
			o += 4
			acc >>= 32
			n -= 32
		}
	}
}

// AffineDequantize is mx.dequantize: the inverse mapping into dst (len
// rows*cols). wq, scales and biases are laid out as AffineQuantize writes
// them, scales and biases of dtype dt. Each element is q·scale + bias
// computed as MLX's CPU backend does it for dt: the product rounded to dt,
// then the sum rounded to dt, so dst holds values of dt widened to float32,
// identical to mx.dequantize's. As there, a float16 product beyond 65504
// is ±Inf even where the sum would fit, and an exact zero, which quantizes
// to the grid's zero code, can come back as ±1 ulp (q·s+b rounds).
func AffineDequantize(wq, scales, biases []byte, cols, groupSize, bits int, dt tensor.DType, dst []float32) error {
	groups, width, err := affineSizes(len(dst), cols, groupSize, bits, dt, wq, scales, biases)
	if err != nil {
		return err
	}
	groupBytes := groupSize * bits / 8
	for g := range groups {
		scale, bias := getScale(scales[g*width:], dt), getScale(biases[g*width:], dt)
		src := wq[g*groupBytes : (g+1)*groupBytes]
		y := dst[g*groupSize : (g+1)*groupSize]
		unpackCodes(y, src, bits)
		for i, q := range y {
			// The conversion rounds the product on its own: no FMA.
			y[i] = tensor.RoundTo(dt, tensor.RoundTo(dt, float32(q*scale))+bias)
		}
	}
	return nil
}

// unpackCodes reads len(dst) codes of bits bits, packed LSB first in
// little-endian uint32 words as packGroup writes them, into dst as floats.
func unpackCodes(dst []float32, src []byte, bits int) {
	mask := uint64(1)<<bits - 1
	var acc uint64
	n, o := 0, 0
	for i := range dst {
		if n < bits {
			acc |= uint64(binary.LittleEndian.Uint32(src[o:])) << n
			o += 4
			n += 32
		}
		dst[i] = float32(uint32(acc & mask))
		acc >>= bits
		n -= bits
	}
}
