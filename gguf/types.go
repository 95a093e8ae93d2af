// Package gguf reads and writes GGUF files (version 3), the container of
// llama.cpp and ggml: a little-endian header of metadata key/value pairs and
// tensor infos, then tensor data, each tensor aligned (32 bytes by default).
//
// The reader parses only the header, through bounded reads, and hands tensor
// bodies out as io.SectionReaders; the writer plans the header and every
// aligned offset first and then writes bodies at their offsets.
//
// Format source: ggml/include/gguf.h, ggml/src/gguf.cpp and gguf-py at
// llama.cpp 34af94c.
package gguf

import "fmt"

// Type is a ggml tensor type (enum ggml_type in ggml.h).
type Type uint32

// The ggml types. Codes 4, 5, 31, 32, 33, 36, 37 and 38 were removed
// upstream and are rejected by the reader.
const (
	TypeF32     Type = 0
	TypeF16     Type = 1
	TypeQ4_0    Type = 2
	TypeQ4_1    Type = 3
	TypeQ5_0    Type = 6
	TypeQ5_1    Type = 7
	TypeQ8_0    Type = 8
	TypeQ8_1    Type = 9
	TypeQ2_K    Type = 10
	TypeQ3_K    Type = 11
	TypeQ4_K    Type = 12
	TypeQ5_K    Type = 13
	TypeQ6_K    Type = 14
	TypeQ8_K    Type = 15
	TypeIQ2_XXS Type = 16
	TypeIQ2_XS  Type = 17
	TypeIQ3_XXS Type = 18
	TypeIQ1_S   Type = 19
	TypeIQ4_NL  Type = 20
	TypeIQ3_S   Type = 21
	TypeIQ2_S   Type = 22
	TypeIQ4_XS  Type = 23
	TypeI8      Type = 24
	TypeI16     Type = 25
	TypeI32     Type = 26
	TypeI64     Type = 27
	TypeF64     Type = 28
	TypeIQ1_M   Type = 29
	TypeBF16    Type = 30
	TypeTQ1_0   Type = 34
	TypeTQ2_0   Type = 35
	TypeMXFP4   Type = 39
	TypeNVFP4   Type = 40
	TypeQ1_0    Type = 41
	TypeQ2_0    Type = 42
)

type typeInfo struct {
	name      string
	blockSize int64 // elements per block
	typeSize  int64 // bytes per block
}

// typeTable follows type_traits in ggml/src/ggml.c and GGML_QUANT_SIZES in
// gguf-py/gguf/constants.py (QK_K = 256).
var typeTable = map[Type]typeInfo{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 18},  // d + 16 nibble bytes
	TypeQ4_1:    {"Q4_1", 32, 20},  // d, m + 16
	TypeQ5_0:    {"Q5_0", 32, 22},  // d + qh[4] + 16
	TypeQ5_1:    {"Q5_1", 32, 24},  // d, m + qh[4] + 16
	TypeQ8_0:    {"Q8_0", 32, 34},  // d + 32 int8
	TypeQ8_1:    {"Q8_1", 32, 36},  // d, s + 32 int8
	TypeQ2_K:    {"Q2_K", 256, 84}, // scales[16] qs[64] d dmin
	TypeQ3_K:    {"Q3_K", 256, 110},
	TypeQ4_K:    {"Q4_K", 256, 144},
	TypeQ5_K:    {"Q5_K", 256, 176},
	TypeQ6_K:    {"Q6_K", 256, 210},
	TypeQ8_K:    {"Q8_K", 256, 292}, // f32 d + 256 int8 + 16 int16
	TypeIQ2_XXS: {"IQ2_XXS", 256, 66},
	TypeIQ2_XS:  {"IQ2_XS", 256, 74},
	TypeIQ3_XXS: {"IQ3_XXS", 256, 98},
	TypeIQ1_S:   {"IQ1_S", 256, 50},
	TypeIQ4_NL:  {"IQ4_NL", 32, 18},
	TypeIQ3_S:   {"IQ3_S", 256, 110},
	TypeIQ2_S:   {"IQ2_S", 256, 82},
	TypeIQ4_XS:  {"IQ4_XS", 256, 136},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", 256, 56},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", 256, 54},
	TypeTQ2_0:   {"TQ2_0", 256, 66},
	TypeMXFP4:   {"MXFP4", 32, 17}, // e8m0 scale + 16 bytes
	TypeNVFP4:   {"NVFP4", 64, 36}, // 4 ue4m3 scales + 32 bytes
	TypeQ1_0:    {"Q1_0", 128, 18}, // d + 16 sign bytes
	TypeQ2_0:    {"Q2_0", 64, 18},  // d + 16 bytes
}

// Known reports whether t is a ggml type this package can size.
func (t Type) Known() bool { _, ok := typeTable[t]; return ok }

// String is the ggml name ("F16", "Q4_K", …), or "type(N)" when unknown.
func (t Type) String() string {
	if i, ok := typeTable[t]; ok {
		return i.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of elements per block (1 for plain types), or 0
// when t is unknown.
func (t Type) BlockSize() int64 { return typeTable[t].blockSize }

// TypeSize is the number of bytes per block, or 0 when t is unknown.
func (t Type) TypeSize() int64 { return typeTable[t].typeSize }

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
	for t, i := range typeTable {
		if equalFold(i.name, name) {
			return t, true
		}
	}
	return 0, false
}

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

// RowSize is the byte length of a row of ne0 elements of t, and false when
// ne0 is not a whole number of blocks or t is unknown.
func (t Type) RowSize(ne0 uint64) (uint64, bool) {
	i, ok := typeTable[t]
	if !ok || ne0%uint64(i.blockSize) != 0 {
		return 0, false
	}
	return ne0 / uint64(i.blockSize) * uint64(i.typeSize), true
}

// ValueType is a metadata value type (enum gguf_type in gguf.h).
type ValueType uint32

// Metadata value types.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"}

// String is the gguf-py name ("UINT32", "STRING", …).
func (v ValueType) String() string {
	if int(v) < len(valueTypeNames) {
		return valueTypeNames[v]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(v))
}

// Known reports whether v is a defined value type.
func (v ValueType) Known() bool { return int(v) < len(valueTypeNames) }

// size is the encoded size of a fixed-size value, 0 for STRING and ARRAY.
func (v ValueType) size() int64 {
	switch v {
	case ValueUint8, ValueInt8, ValueBool:
		return 1
	case ValueUint16, ValueInt16:
		return 2
	case ValueUint32, ValueInt32, ValueFloat32:
		return 4
	case ValueUint64, ValueInt64, ValueFloat64:
		return 8
	}
	return 0
}
