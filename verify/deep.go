package verify

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// What --deep checks, per storage type (DeepCheck in the CLI help):
//
//   - F32, F64, F16, BF16, F8_E4M3, F8_E5M2: every value is finite (no NaN,
//     no ±Inf) and at least one value is not ±0.
//   - GGUF Q8_0: every block's fp16 scale d is finite, and some block has
//     d ≠ 0 and a nonzero quant, so some dequantized value is nonzero.
//   - GGUF Q4_0, Q5_0, Q4_1, Q5_1: every block's fp16 d (and m) is finite,
//     and some block's d or m is nonzero.
//   - GGUF K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: every super-block's fp16
//     d (and dmin, where the type has one) is finite, and some super-block
//     has d or dmin nonzero. The 6-bit sub-block scales are not decoded.
//   - Packed or integer data (MLX U32 weights, I8, U8, …) and other GGUF
//     types: only "not all zero bytes"; finiteness does not apply. MLX
//     scales and biases are float tensors and get the float check.

// field is a float inside each unit of a layout.
type field struct {
	off  int
	kind byte // 'h' f16, 'b' bf16, 'f' f32, 'd' f64, '4' f8_e4m3, '5' f8_e5m2
}

// layout says how to scan a storage type: units of unit bytes, each holding
// the floats in fields; for block types, a block counts as nonzero only when
// a scale is nonzero and (if payload is set) a payload byte is nonzero.
type layout struct {
	unit    int
	fields  []field
	payload [2]int // byte range of the quants within a block, or {0,0}
	desc    string
}

var floatLayouts = map[tensor.DType]layout{
	tensor.F32:     {4, []field{{0, 'f'}}, [2]int{}, "every value finite, not all zero"},
	tensor.F64:     {8, []field{{0, 'd'}}, [2]int{}, "every value finite, not all zero"},
	tensor.F16:     {2, []field{{0, 'h'}}, [2]int{}, "every value finite, not all zero"},
	tensor.BF16:    {2, []field{{0, 'b'}}, [2]int{}, "every value finite, not all zero"},
	tensor.F8_E4M3: {1, []field{{0, '4'}}, [2]int{}, "every value finite, not all zero"},
	tensor.F8_E5M2: {1, []field{{0, '5'}}, [2]int{}, "every value finite, not all zero"},
}

var floatKinds = map[quant.FloatKind]byte{quant.Half: 'h', quant.BFloat16: 'b', quant.Float32: 'f', quant.Float64: 'd'}

// ggmlLayout is how --deep scans a GGUF type, or false when it does not
// decode it. It decodes the plain float types and the block types ferry
// can decode; the block size and where each block's floats sit come from
// gguf/quant's type table (ggml-common.h).
func ggmlLayout(t quant.Type) (layout, bool) {
	fs := t.Floats()
	if len(fs) == 0 || (t.Quantized() && !t.CanDecode()) {
		return layout{}, false
	}
	l := layout{unit: int(t.TypeSize())}
	names := make([]string, len(fs))
	for i, f := range fs {
		l.fields = append(l.fields, field{f.Offset, floatKinds[f.Kind]})
		names[i] = f.Name
	}
	switch {
	case !t.Quantized():
		l.desc = "every value finite, not all zero"
	case t == quant.Q8_0:
		// Symmetric int8 quants after the 2-byte d: a zero quant is a
		// zero value whatever d is.
		l.payload = [2]int{2, l.unit}
		l.desc = "every block's scale d finite; some value nonzero"
	default:
		block := "block"
		if t.BlockSize() == quant.QK_K {
			block = "super-block"
		}
		l.desc = fmt.Sprintf("every %s's %s finite, not all zero", block, strings.Join(names, " and "))
	}
	return l, true
}

// bytesLayout checks only that not every byte is zero.
var bytesLayout = layout{1, nil, [2]int{0, 1}, "not all zero bytes (finiteness does not apply)"}

func finite(buf []byte, f field) (ok, nonzero bool) {
	b := buf[f.off:]
	switch f.kind {
	case 'h':
		h := binary.LittleEndian.Uint16(b)
		return h&0x7C00 != 0x7C00, h&0x7FFF != 0
	case 'b':
		h := binary.LittleEndian.Uint16(b)
		return h&0x7F80 != 0x7F80, h&0x7FFF != 0
	case 'f':
		u := binary.LittleEndian.Uint32(b)
		return u&0x7F800000 != 0x7F800000, u&0x7FFFFFFF != 0
	case 'd':
		u := binary.LittleEndian.Uint64(b)
		return u&0x7FF0000000000000 != 0x7FF0000000000000, u&(math.MaxUint64>>1) != 0
	case '4': // OCP E4M3FN: only S.1111.111 is NaN, no infinities
		return b[0]&0x7F != 0x7F, b[0]&0x7F != 0
	case '5': // E5M2: exponent 11111 is Inf/NaN
		return b[0]&0x7C != 0x7C, b[0]&0x7F != 0
	}
	return true, false
}

// scanResult is what one tensor's scan found.
type scanResult struct {
	units    int64
	badUnit  int64 // first unit with a non-finite field, or -1
	nonzero  bool
	bytes    int64
	desc     string
	notFound string // a reason the scan did not run
}

var errUnitSize = errors.New("size is not a whole number of units")

// scan reads size bytes from r in bounded chunks and applies l.
func scan(r io.Reader, size int64, l layout) (scanResult, error) {
	res := scanResult{badUnit: -1, desc: l.desc}
	if size%int64(l.unit) != 0 {
		return res, fmt.Errorf("%w: %d bytes in %d-byte units", errUnitSize, size, l.unit)
	}
	const chunkTarget = 1 << 20
	chunk := chunkTarget - chunkTarget%l.unit
	buf := make([]byte, min(int64(chunk), size))
	for res.bytes < size {
		n := int64(len(buf))
		if rem := size - res.bytes; rem < n {
			n = rem
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return res, err
		}
		for u := 0; u < int(n); u += l.unit {
			unit := buf[u : u+l.unit]
			scaleNZ := len(l.fields) == 0
			for _, f := range l.fields {
				ok, nz := finite(unit, f)
				if !ok && res.badUnit < 0 {
					res.badUnit = res.units
				}
				scaleNZ = scaleNZ || nz
			}
			if !res.nonzero && scaleNZ {
				if l.payload[1] == 0 {
					res.nonzero = true
				} else {
					for _, c := range unit[l.payload[0]:min(l.payload[1], len(unit))] {
						if c != 0 {
							res.nonzero = true
							break
						}
					}
				}
			}
			res.units++
		}
		res.bytes += n
	}
	return res, nil
}

// verdictText renders a scan for the report and says whether it failed.
func (s scanResult) text(what string, unitBytes int, off int64) (string, string) {
	if s.notFound != "" {
		return "not checked: " + s.notFound, ""
	}
	if s.badUnit >= 0 {
		msg := fmt.Sprintf("non-finite %s at byte offset %d", what, off+s.badUnit*int64(unitBytes))
		return msg, msg
	}
	if !s.nonzero {
		return "all zeros", "all zeros: the head's weights were never filled in"
	}
	return s.desc, ""
}
