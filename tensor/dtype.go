// Package tensor holds the element types shared by every format ferry reads
// and writes, and the conversion kernels between them.
package tensor

import (
	"fmt"
	"strings"
)

// DType is a safetensors element type, named as in the safetensors header
// ("BF16", "F32", …).
type DType string

// The safetensors dtypes, in the reference implementation's declaration order
// (huggingface/safetensors `enum Dtype`).
const (
	BOOL        DType = "BOOL"
	F4          DType = "F4"
	F6_E2M3     DType = "F6_E2M3"
	F6_E3M2     DType = "F6_E3M2"
	U8          DType = "U8"
	I8          DType = "I8"
	F8_E5M2     DType = "F8_E5M2"
	F8_E4M3     DType = "F8_E4M3"
	F8_E8M0     DType = "F8_E8M0"
	F8_E4M3FNUZ DType = "F8_E4M3FNUZ"
	F8_E5M2FNUZ DType = "F8_E5M2FNUZ"
	I16         DType = "I16"
	U16         DType = "U16"
	F16         DType = "F16"
	BF16        DType = "BF16"
	I32         DType = "I32"
	U32         DType = "U32"
	F32         DType = "F32"
	C64         DType = "C64"
	F64         DType = "F64"
	I64         DType = "I64"
	U64         DType = "U64"
)

type dtypeInfo struct {
	bits  int  // bits per logical element
	float bool // a floating-point kind ferry can convert (F16, BF16, F32, F64)
	order int  // position in the reference enum
}

var dtypes = map[DType]dtypeInfo{
	BOOL: {8, false, 0}, F4: {4, false, 1}, F6_E2M3: {6, false, 2}, F6_E3M2: {6, false, 3},
	U8: {8, false, 4}, I8: {8, false, 5}, F8_E5M2: {8, false, 6}, F8_E4M3: {8, false, 7},
	F8_E8M0: {8, false, 8}, F8_E4M3FNUZ: {8, false, 9}, F8_E5M2FNUZ: {8, false, 10},
	I16: {16, false, 11}, U16: {16, false, 12}, F16: {16, true, 13}, BF16: {16, true, 14},
	I32: {32, false, 15}, U32: {32, false, 16}, F32: {32, true, 17}, C64: {64, false, 18},
	F64: {64, true, 19}, I64: {64, false, 20}, U64: {64, false, 21},
}

// DTypes lists every known dtype in the reference declaration order.
func DTypes() []DType {
	out := make([]DType, len(dtypes))
	for d, i := range dtypes {
		out[i.order] = d
	}
	return out
}

// dtypeAliases are the names PyTorch and NumPy users type for the float
// dtypes (torch.bfloat16, np.float16, "fp32", …).
var dtypeAliases = map[string]DType{
	"bfloat16": BF16, "float16": F16, "fp16": F16, "half": F16,
	"float32": F32, "fp32": F32, "float": F32, "float64": F64, "fp64": F64, "double": F64,
}

// ParseDType parses a dtype as users type it: a safetensors name in any
// case ("bf16", "F32") or a PyTorch/NumPy alias ("bfloat16", "fp16").
func ParseDType(s string) (DType, error) {
	if d, ok := dtypeAliases[strings.ToLower(s)]; ok {
		return d, nil
	}
	if d := DType(strings.ToUpper(s)); d.Known() {
		return d, nil
	}
	return "", fmt.Errorf("unknown dtype %q", s)
}

// Known reports whether d is a dtype of the safetensors format.
func (d DType) Known() bool { _, ok := dtypes[d]; return ok }

// Bits is the size of one logical element in bits (4 for F4, 6 for F6_*).
// It is 0 for an unknown dtype.
func (d DType) Bits() int { return dtypes[d].bits }

// Convertible reports whether ferry's kernels can read d as float32
// (F16, BF16, F32, F64). Other known kinds are carried as opaque bytes.
func (d DType) Convertible() bool { return dtypes[d].float }

// Order is d's position in the reference enum; the reference writer sorts
// tensors by descending order, then by name.
func (d DType) Order() int { return dtypes[d].order }

// ByteSize returns the byte length of a tensor of d with the given shape,
// following the reference rules: numel × bits must be a multiple of 8, and
// no intermediate product may overflow int64.
func ByteSize(d DType, shape []int64) (int64, error) {
	info, ok := dtypes[d]
	if !ok {
		return 0, fmt.Errorf("unknown dtype %q", string(d))
	}
	n, err := NumElements(shape)
	if err != nil {
		return 0, err
	}
	const max = int64(^uint64(0) >> 1)
	if n > max/int64(info.bits) {
		return 0, fmt.Errorf("shape %v: size overflows", shape)
	}
	bits := n * int64(info.bits)
	if bits%8 != 0 {
		return 0, fmt.Errorf("shape %v of %s: %d bits is not a whole number of bytes", shape, d, bits)
	}
	return bits / 8, nil
}

// NumElements is the product of shape (1 for a scalar), with overflow and
// negative dimensions reported as errors.
func NumElements(shape []int64) (int64, error) {
	n := int64(1)
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("shape %v: negative dimension", shape)
		}
		if s != 0 && n > (int64(^uint64(0)>>1))/s {
			return 0, fmt.Errorf("shape %v: element count overflows", shape)
		}
		n *= s
	}
	return n, nil
}
