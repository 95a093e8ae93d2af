package gguf

// Constructors for metadata pairs with the value types gguf-py's
// add_* helpers use.

// U32 is a UINT32 pair.
func U32(key string, v uint32) KV { return KV{key, ValueUint32, v} }

// I32 is an INT32 pair.
func I32(key string, v int32) KV { return KV{key, ValueInt32, v} }

// U64 is a UINT64 pair.
func U64(key string, v uint64) KV { return KV{key, ValueUint64, v} }

// F32 is a FLOAT32 pair.
func F32(key string, v float32) KV { return KV{key, ValueFloat32, v} }

// Bool is a BOOL pair.
func Bool(key string, v bool) KV { return KV{key, ValueBool, v} }

// Str is a STRING pair.
func Str(key, v string) KV { return KV{key, ValueString, v} }

// Strings is an ARRAY of STRING pair.
func Strings(key string, v []string) KV {
	return KV{key, ValueArray, Array{ValueString, v}}
}

// I32s is an ARRAY of INT32 pair.
func I32s(key string, v []int32) KV {
	return KV{key, ValueArray, Array{ValueInt32, v}}
}
