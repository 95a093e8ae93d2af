// Package quant holds what ferry knows about ggml's tensor types: the type
// codes and their block traits (elements and bytes per block, where the
// float fields sit in a block), the llama_ftype enum written as
// general.file_type, the encoders from float32 rows into ggml blocks,
// Policy, the per-tensor type choice a writer asks for and never makes, and
// Mix, llama-quantize's choice of every tensor's type in a file of a given
// type (Q4_K_M …), with LoaderLess, the llama.cpp loader's tensor order.
//
// It is the one table of ggml types (rows, one Traits row a type: sizes,
// block floats, encoder, weighted encoder, decoder, fallback): the GGUF
// reader and writer size tensors with it, gguf/convert and gguf/quantize
// encode with it, verify decodes scales with it. It knows no file format,
// and no model family: the arch facts llama-quantize's rules read are the
// family descriptors' (internal/family).
//
// Sources: enum ggml_type and type_traits in ggml/include/ggml.h and
// ggml/src/ggml.c, block layouts in ggml/src/ggml-common.h, and
// GGML_QUANT_SIZES in gguf-py/gguf/constants.py, all at llama.cpp 34af94c
// (../shared/notes/llamacpp.md §1.6, §1.7).
package quant

import (
	"fmt"

	"github.com/ferry-llm/ferry/tensor"
)

// Type is a ggml tensor type (enum ggml_type).
type Type uint32

// The ggml types. Codes 4, 5, 31, 32, 33, 36, 37 and 38 were removed
// upstream and are unknown here.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

// QK_K is the number of elements in a K-quant super-block.
const QK_K = 256

// FloatKind is how a float field inside a block is stored.
type FloatKind uint8

// Float encodings, all little-endian.
const (
	Half     FloatKind = iota + 1 // IEEE binary16
	BFloat16                      // bfloat16
	Float32                       // IEEE binary32
	Float64                       // IEEE binary64
)

// Field is a float inside each block of a type: the element itself for the
// plain float types, a block scale (d) or minimum (m, dmin) for the
// quantized ones.
type Field struct {
	Name   string
	Offset int // bytes from the start of the block
	Kind   FloatKind
}

// Traits is one row of the ggml type table: everything ferry knows about a
// type, from its block size to the functions that encode and decode it.
// Every package reads a type's traits from this row (through the methods
// on Type and Encode, EncodeWeighted, Decode); adding a ggml type, or an
// encoder for one, is adding or filling in its row in rows.
type Traits struct {
	Type      Type
	Name      string  // ggml's type name (GGML_QUANT_SIZES key)
	BlockSize int64   // elements per block (blck_size; 1 for plain types)
	TypeSize  int64   // bytes per block (type_size)
	Floats    []Field // the float fields of a block; nil where not recorded here

	// Encode writes whole blocks of float32 values as the type, as ggml's
	// from_float_ref does (quantize_row_*_ref: what llama-quantize runs
	// without an importance matrix); nil where ferry cannot encode it. It
	// is a pure function of (dst, src), safe on disjoint blocks at once.
	Encode func(dst []byte, src []float32)

	// EncodeWeighted quantizes one row, src, with its importance weights
	// qw (one per value) into dst, as ggml's quantize_* does when
	// llama-quantize passes it an importance matrix; nil where ggml ignores
	// the weights (Q8_0 and the float types: EncodeWeighted encodes those
	// with Encode). Set only where Encode is.
	EncodeWeighted func(dst []byte, src, qw []float32)

	// Decode turns whole blocks back into float32 values, as ggml's
	// to_float does; nil where ferry cannot decode the type.
	Decode func(dst []float32, src []byte)

	// Fallback is the type llama-quantize gives a tensor of this type
	// whose rows are not a whole number of its blocks
	// (tensor_type_fallback, llamacpp.md §3.6; F16 when the fallback's
	// blocks do not divide the row either). The zero value, F32, is no
	// fallback: such a tensor is refused.
	Fallback Type
}

var (
	value = []Field{{"x", 0, Half}}
	d     = []Field{{"d", 0, Half}}
	dm    = []Field{{"d", 0, Half}, {"m", 2, Half}}
	dmin  = []Field{{"d", 0, Half}, {"dmin", 2, Half}}
)

// rows is the type table: one row per ggml type, in code order. Sizes
// follow type_traits in ggml.c and GGML_QUANT_SIZES; float fields follow
// the block structs of ggml-common.h (each row's comment is its layout).
var rows = []Traits{
	{Type: F32, Name: "F32", BlockSize: 1, TypeSize: 4, Floats: []Field{{"x", 0, Float32}},
		Encode: tensor.F32ToBytes, Decode: tensor.BytesToF32},
	{Type: F16, Name: "F16", BlockSize: 1, TypeSize: 2, Floats: value,
		Encode: tensor.F32ToF16, Decode: decodeF16},
	{Type: Q4_0, Name: "Q4_0", BlockSize: 32, TypeSize: 18, Floats: d, // d, qs[16]
		Encode: q4_0.encode, EncodeWeighted: q4_0.encodeWeighted, Decode: q4_0.decode},
	{Type: Q4_1, Name: "Q4_1", BlockSize: 32, TypeSize: 20, Floats: dm, // d, m, qs[16]
		Encode: q4_1.encode, EncodeWeighted: q4_1.encodeWeighted, Decode: q4_1.decode},
	{Type: Q5_0, Name: "Q5_0", BlockSize: 32, TypeSize: 22, Floats: d, // d, qh[4], qs[16]
		Encode: q5_0.encode, EncodeWeighted: q5_0.encodeWeighted, Decode: q5_0.decode},
	{Type: Q5_1, Name: "Q5_1", BlockSize: 32, TypeSize: 24, Floats: dm, // d, m, qh[4], qs[16]
		Encode: q5_1.encode, EncodeWeighted: q5_1.encodeWeighted, Decode: q5_1.decode},
	{Type: Q8_0, Name: "Q8_0", BlockSize: 32, TypeSize: 34, Floats: d, // d, qs int8[32]
		Encode: quantizeQ8_0, Decode: decodeQ8_0},
	{Type: Q8_1, Name: "Q8_1", BlockSize: 32, TypeSize: 36, Floats: []Field{{"d", 0, Half}, {"s", 2, Half}}}, // d, s, qs int8[32]
	{Type: Q2_K, Name: "Q2_K", BlockSize: QK_K, TypeSize: 84, Floats: []Field{{"d", 80, Half}, {"dmin", 82, Half}}, // scales[16], qs[64], d, dmin
		Encode: quantizeQ2_K, EncodeWeighted: weightedQ2_K, Decode: decodeQ2_K, Fallback: Q4_0},
	{Type: Q3_K, Name: "Q3_K", BlockSize: QK_K, TypeSize: 110, Floats: []Field{{"d", 108, Half}}, // hmask[32], qs[64], scales[12], d
		Encode: quantizeQ3_K, EncodeWeighted: weightedQ3_K, Decode: decodeQ3_K, Fallback: Q4_0},
	{Type: Q4_K, Name: "Q4_K", BlockSize: QK_K, TypeSize: 144, Floats: dmin, // d, dmin, scales[12], qs[128]
		Encode: quantizeQ4_K, EncodeWeighted: weightedQ4_K, Decode: decodeQ4_K, Fallback: Q5_0},
	{Type: Q5_K, Name: "Q5_K", BlockSize: QK_K, TypeSize: 176, Floats: dmin, // d, dmin, scales[12], qh[32], qs[128]
		Encode: quantizeQ5_K, EncodeWeighted: weightedQ5_K, Decode: decodeQ5_K, Fallback: Q5_1},
	{Type: Q6_K, Name: "Q6_K", BlockSize: QK_K, TypeSize: 210, Floats: []Field{{"d", 208, Half}}, // ql[128], qh[64], scales[16], d
		Encode: quantizeQ6_K, EncodeWeighted: weightedQ6_K, Decode: decodeQ6_K, Fallback: Q8_0},
	{Type: Q8_K, Name: "Q8_K", BlockSize: QK_K, TypeSize: 292, Floats: []Field{{"d", 0, Float32}}}, // f32 d, qs int8[256], bsums int16[16]
	{Type: IQ2_XXS, Name: "IQ2_XXS", BlockSize: QK_K, TypeSize: 66, Fallback: IQ4_NL},
	{Type: IQ2_XS, Name: "IQ2_XS", BlockSize: QK_K, TypeSize: 74, Fallback: IQ4_NL},
	{Type: IQ3_XXS, Name: "IQ3_XXS", BlockSize: QK_K, TypeSize: 98, Fallback: IQ4_NL},
	{Type: IQ1_S, Name: "IQ1_S", BlockSize: QK_K, TypeSize: 50, Fallback: IQ4_NL},
	{Type: IQ4_NL, Name: "IQ4_NL", BlockSize: 32, TypeSize: 18},
	{Type: IQ3_S, Name: "IQ3_S", BlockSize: QK_K, TypeSize: 110, Fallback: IQ4_NL},
	{Type: IQ2_S, Name: "IQ2_S", BlockSize: QK_K, TypeSize: 82, Fallback: IQ4_NL},
	{Type: IQ4_XS, Name: "IQ4_XS", BlockSize: QK_K, TypeSize: 136, Fallback: IQ4_NL},
	{Type: I8, Name: "I8", BlockSize: 1, TypeSize: 1},
	{Type: I16, Name: "I16", BlockSize: 1, TypeSize: 2},
	{Type: I32, Name: "I32", BlockSize: 1, TypeSize: 4},
	{Type: I64, Name: "I64", BlockSize: 1, TypeSize: 8},
	{Type: F64, Name: "F64", BlockSize: 1, TypeSize: 8, Floats: []Field{{"x", 0, Float64}}},
	{Type: IQ1_M, Name: "IQ1_M", BlockSize: QK_K, TypeSize: 56, Fallback: IQ4_NL},
	{Type: BF16, Name: "BF16", BlockSize: 1, TypeSize: 2, Floats: []Field{{"x", 0, BFloat16}},
		Encode: tensor.F32ToBF16, Decode: tensor.BF16ToF32},
	{Type: TQ1_0, Name: "TQ1_0", BlockSize: QK_K, TypeSize: 54, Fallback: Q4_0},
	{Type: TQ2_0, Name: "TQ2_0", BlockSize: QK_K, TypeSize: 66, Fallback: Q4_0},
	{Type: MXFP4, Name: "MXFP4", BlockSize: 32, TypeSize: 17},               // e8m0 scale + 16 bytes
	{Type: NVFP4, Name: "NVFP4", BlockSize: 64, TypeSize: 36},               // 4 ue4m3 scales + 32 bytes
	{Type: Q1_0, Name: "Q1_0", BlockSize: 128, TypeSize: 18},                // d + 16 sign bytes
	{Type: Q2_0, Name: "Q2_0", BlockSize: 64, TypeSize: 18, Fallback: Q4_0}, // d + 16 bytes
}

// typeCodes bounds the type codes the table holds (ggml's GGML_TYPE_COUNT
// is 43 at 34af94c).
const typeCodes = 64

// table is rows indexed by type code: a type's row is one array index
// away, so Encode and Decode cost no map lookup.
var table = index(rows)

// index places each row at its code. Two rows for one code, or a code
// out of range, is a mistake in rows and stops the program at start.
func index(rs []Traits) *[typeCodes]Traits {
	var t [typeCodes]Traits
	for _, r := range rs {
		if r.Type >= typeCodes || t[r.Type].Name != "" {
			panic(fmt.Sprintf("quant: type table: row %s (code %d) out of range or twice", r.Name, r.Type))
		}
		t[r.Type] = r
	}
	return &t
}

// unknown is the row of every type not in the table.
var unknown Traits

// row is t's row, or the empty row when t is unknown.
func (t Type) row() *Traits {
	if t < typeCodes {
		return &table[t]
	}
	return &unknown
}

// TraitsOf is t's row of the type table, and false when t is unknown.
func TraitsOf(t Type) (Traits, bool) {
	r := t.row()
	return *r, r.Name != ""
}

// Known reports whether t is a ggml type this package can size.
func (t Type) Known() bool { return t.row().Name != "" }

// String is the ggml name ("F16", "Q4_K", …), or "type(N)" when unknown.
func (t Type) String() string {
	if r := t.row(); r.Name != "" {
		return r.Name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements per block (1 for plain types), or 0
// when t is unknown.
func (t Type) BlockSize() int64 { return t.row().BlockSize }

// TypeSize is the number of bytes per block, or 0 when t is unknown.
func (t Type) TypeSize() int64 { return t.row().TypeSize }

// Quantized is ggml_is_quantized: a block type (more than one element a
// block), not a plain float or integer type; false when t is unknown.
func (t Type) Quantized() bool { return t.row().BlockSize > 1 }

// Floats lists the float fields in each block of t, in byte order: the
// value of a plain float type, the scales and minimums of a block type. It
// is nil for integer types and for types whose layout is not recorded here
// (the IQ, TQ and FP4 families).
func (t Type) Floats() []Field { return t.row().Floats }

// RowSize is the byte length of a row of ne0 elements of t, and false when
// ne0 is not a whole number of blocks or t is unknown.
func (t Type) RowSize(ne0 uint64) (uint64, bool) {
	r := t.row()
	if r.Name == "" || ne0%uint64(r.BlockSize) != 0 {
		return 0, false
	}
	return ne0 / uint64(r.BlockSize) * uint64(r.TypeSize), true
}

// Types lists every known type in code order.
func Types() []Type {
	var out []Type
	for t := Type(0); t < typeCodes; t++ {
		if t.Known() {
			out = append(out, t)
		}
	}
	return out
}

// ParseType looks a type up by its ggml name, case-insensitively.
func ParseType(name string) (Type, bool) {
	for _, r := range table {
		if r.Name != "" && equalFold(r.Name, name) {
			return r.Type, true
		}
	}
	return 0, false
}

// equalFold compares ASCII names case-insensitively.
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'a' <= x && x <= 'z' {
			x -= 'a' - 'A'
		}
		if 'a' <= y && y <= 'z' {
			y -= 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
