// Package quant holds what ferry knows about ggml's tensor types: the type
// codes and their block traits (elements and bytes per block, where the
// float fields sit in a block), the llama_ftype enum written as
// general.file_type, the encoders from float32 rows into ggml blocks,
// Policy, the per-tensor type choice a writer asks for and never makes, and
// Mix, llama-quantize's choice of every tensor's type in a file of a given
// type (Q4_K_M …), with LoaderLess, the llama.cpp loader's tensor order.
//
// It is the one table of ggml types: the GGUF reader and writer size
// tensors with it, gguf/convert encodes with it, verify decodes scales with
// it. It knows no file format, and of model families only the arch names
// llama-quantize's rules test (mix.go).
//
// Sources: enum ggml_type and type_traits in ggml/include/ggml.h and
// ggml/src/ggml.c, block layouts in ggml/src/ggml-common.h, and
// GGML_QUANT_SIZES in gguf-py/gguf/constants.py, all at llama.cpp 34af94c
// (../shared/notes/llamacpp.md §1.6, §1.7).
package quant

import "fmt"

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

type traits struct {
	name      string
	blockSize int64   // elements per block
	typeSize  int64   // bytes per block
	floats    []Field // nil where the layout is not recorded here
}

var (
	value = []Field{{"x", 0, Half}}
	d     = []Field{{"d", 0, Half}}
	dm    = []Field{{"d", 0, Half}, {"m", 2, Half}}
	dmin  = []Field{{"d", 0, Half}, {"dmin", 2, Half}}
)

// table follows type_traits in ggml.c and GGML_QUANT_SIZES; float fields
// follow the block structs of ggml-common.h.
var table = map[Type]traits{
	F32:     {"F32", 1, 4, []Field{{"x", 0, Float32}}},
	F16:     {"F16", 1, 2, value},
	Q4_0:    {"Q4_0", 32, 18, d},                                              // d, qs[16]
	Q4_1:    {"Q4_1", 32, 20, dm},                                             // d, m, qs[16]
	Q5_0:    {"Q5_0", 32, 22, d},                                              // d, qh[4], qs[16]
	Q5_1:    {"Q5_1", 32, 24, dm},                                             // d, m, qh[4], qs[16]
	Q8_0:    {"Q8_0", 32, 34, d},                                              // d, qs int8[32]
	Q8_1:    {"Q8_1", 32, 36, []Field{{"d", 0, Half}, {"s", 2, Half}}},        // d, s, qs int8[32]
	Q2_K:    {"Q2_K", QK_K, 84, []Field{{"d", 80, Half}, {"dmin", 82, Half}}}, // scales[16], qs[64], d, dmin
	Q3_K:    {"Q3_K", QK_K, 110, []Field{{"d", 108, Half}}},                   // hmask[32], qs[64], scales[12], d
	Q4_K:    {"Q4_K", QK_K, 144, dmin},                                        // d, dmin, scales[12], qs[128]
	Q5_K:    {"Q5_K", QK_K, 176, dmin},                                        // d, dmin, scales[12], qh[32], qs[128]
	Q6_K:    {"Q6_K", QK_K, 210, []Field{{"d", 208, Half}}},                   // ql[128], qh[64], scales[16], d
	Q8_K:    {"Q8_K", QK_K, 292, []Field{{"d", 0, Float32}}},                  // f32 d, qs int8[256], bsums int16[16]
	IQ2_XXS: {"IQ2_XXS", QK_K, 66, nil},
	IQ2_XS:  {"IQ2_XS", QK_K, 74, nil},
	IQ3_XXS: {"IQ3_XXS", QK_K, 98, nil},
	IQ1_S:   {"IQ1_S", QK_K, 50, nil},
	IQ4_NL:  {"IQ4_NL", 32, 18, nil},
	IQ3_S:   {"IQ3_S", QK_K, 110, nil},
	IQ2_S:   {"IQ2_S", QK_K, 82, nil},
	IQ4_XS:  {"IQ4_XS", QK_K, 136, nil},
	I8:      {"I8", 1, 1, nil},
	I16:     {"I16", 1, 2, nil},
	I32:     {"I32", 1, 4, nil},
	I64:     {"I64", 1, 8, nil},
	F64:     {"F64", 1, 8, []Field{{"x", 0, Float64}}},
	IQ1_M:   {"IQ1_M", QK_K, 56, nil},
	BF16:    {"BF16", 1, 2, []Field{{"x", 0, BFloat16}}},
	TQ1_0:   {"TQ1_0", QK_K, 54, nil},
	TQ2_0:   {"TQ2_0", QK_K, 66, nil},
	MXFP4:   {"MXFP4", 32, 17, nil}, // e8m0 scale + 16 bytes
	NVFP4:   {"NVFP4", 64, 36, nil}, // 4 ue4m3 scales + 32 bytes
	Q1_0:    {"Q1_0", 128, 18, nil}, // d + 16 sign bytes
	Q2_0:    {"Q2_0", 64, 18, nil},  // d + 16 bytes
}

// Known reports whether t is a ggml type this package can size.
func (t Type) Known() bool { _, ok := table[t]; return ok }

// String is the ggml name ("F16", "Q4_K", …), or "type(N)" when unknown.
func (t Type) String() string {
	if i, ok := table[t]; ok {
		return i.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements per block (1 for plain types), or 0
// when t is unknown.
func (t Type) BlockSize() int64 { return table[t].blockSize }

// TypeSize is the number of bytes per block, or 0 when t is unknown.
func (t Type) TypeSize() int64 { return table[t].typeSize }

// Floats lists the float fields in each block of t, in byte order: the
// value of a plain float type, the scales and minimums of a block type. It
// is nil for integer types and for types whose layout is not recorded here
// (the IQ, TQ and FP4 families).
func (t Type) Floats() []Field { return table[t].floats }

// RowSize is the byte length of a row of ne0 elements of t, and false when
// ne0 is not a whole number of blocks or t is unknown.
func (t Type) RowSize(ne0 uint64) (uint64, bool) {
	i, ok := table[t]
	if !ok || ne0%uint64(i.blockSize) != 0 {
		return 0, false
	}
	return ne0 / uint64(i.blockSize) * uint64(i.typeSize), true
}

// Types lists every known type in code order.
func Types() []Type {
	var out []Type
	for t := Type(0); t < 64; t++ {
		if t.Known() {
			out = append(out, t)
		}
	}
	return out
}

// ParseType looks a type up by its ggml name, case-insensitively.
func ParseType(name string) (Type, bool) {
	for t, i := range table {
		if equalFold(i.name, name) {
			return t, true
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
