// Package gguf reads and writes GGUF files (version 3), the container of
// llama.cpp and ggml: a little-endian header of metadata key/value pairs and
// tensor infos, then tensor data, each tensor aligned (32 bytes by default).
//
// The reader parses only the header, through bounded reads, and hands tensor
// bodies out as io.SectionReaders; the writer plans the header and every
// aligned offset first and then writes bodies at their offsets.
//
// Tensor types (quant.Type) and their block sizes are gguf/quant's; this
// package only sizes tensors with them.
//
// Format source: ggml/include/gguf.h, ggml/src/gguf.cpp and gguf-py at
// llama.cpp 34af94c.
package gguf

import "fmt"

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
