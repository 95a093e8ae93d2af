// Package ggufcheck cross-checks a GGUF file with an independent reader,
// github.com/gpustack/gguf-parser-go. It is imported only by tests.
package ggufcheck

import (
	"fmt"
	"reflect"

	parser "github.com/gpustack/gguf-parser-go"

	"github.com/ferry-llm/ferry/gguf"
)

// Check parses path with both gguf-parser-go and gguf.Open and reports any
// disagreement: KV keys, value types and scalar values; tensor names,
// types, dims and offsets.
func Check(path string) error {
	pf, err := parser.ParseGGUFFile(path)
	if err != nil {
		return fmt.Errorf("gguf-parser-go: %w", err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return fmt.Errorf("gguf reader: %w", err)
	}
	defer f.Close()
	if uint64(len(f.KVs)) != pf.Header.MetadataKVCount || len(pf.Header.MetadataKV) != len(f.KVs) {
		return fmt.Errorf("%d KVs, gguf-parser-go %d", len(f.KVs), len(pf.Header.MetadataKV))
	}
	for i, pkv := range pf.Header.MetadataKV {
		kv := f.KVs[i]
		if kv.Key != pkv.Key || uint32(kv.Type) != uint32(pkv.ValueType) {
			return fmt.Errorf("KV %d: %s %s, gguf-parser-go %s %d", i, kv.Key, kv.Type, pkv.Key, pkv.ValueType)
		}
		if arr, ok := kv.Value.(gguf.Array); ok {
			pa, ok := pkv.Value.(parser.GGUFMetadataKVArrayValue)
			if !ok {
				return fmt.Errorf("KV %s: gguf-parser-go value %T", kv.Key, pkv.Value)
			}
			if uint32(pa.Type) != uint32(arr.Elem) || pa.Len != uint64(arr.Len()) {
				return fmt.Errorf("KV %s: array %s×%d, gguf-parser-go %d×%d", kv.Key, arr.Elem, arr.Len(), pa.Type, pa.Len)
			}
			continue
		}
		if !reflect.DeepEqual(kv.Value, pkv.Value) {
			return fmt.Errorf("KV %s: %v (%T), gguf-parser-go %v (%T)", kv.Key, kv.Value, kv.Value, pkv.Value, pkv.Value)
		}
	}
	if len(pf.TensorInfos) != len(f.Tensors) {
		return fmt.Errorf("%d tensors, gguf-parser-go %d", len(f.Tensors), len(pf.TensorInfos))
	}
	for i, pt := range pf.TensorInfos {
		t := f.Tensors[i]
		if t.Name != pt.Name || uint32(t.Type) != uint32(pt.Type) || !reflect.DeepEqual(t.Dims, pt.Dimensions) || t.Offset != pt.Offset {
			return fmt.Errorf("tensor %d: %s %s %v @%d, gguf-parser-go %s %d %v @%d", i, t.Name, t.Type, t.Dims, t.Offset, pt.Name, pt.Type, pt.Dimensions, pt.Offset)
		}
	}
	if pf.Size != parser.GGUFBytesScalar(f.Size) && pf.Size != 0 {
		return fmt.Errorf("size %d, gguf-parser-go %d", f.Size, pf.Size)
	}
	return nil
}
