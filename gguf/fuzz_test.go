package gguf

import (
	"bytes"
	"os"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// FuzzReader feeds arbitrary bytes to Parse: it must never panic, and what
// it accepts must be self-consistent and re-encode to the same header.
func FuzzReader(f *testing.F) {
	if b, err := os.ReadFile("testdata/qwen3-base-Q8_0.gguf"); err == nil {
		f.Add(b[:min(len(b), 64<<10)])
	}
	f.Add(new(builder).head(0, 0).Bytes())
	f.Add(new(builder).head(1, 1).str("general.alignment").u32(uint32(ValueUint32)).u32(32).tensor("t", []uint64{32, 2}, quant.Q8_0, 0).alignTo(32).pad(96).Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(bytes.NewReader(data), int64(len(data)), "fuzz.gguf")
		if err != nil {
			return
		}
		if file.DataOffset > int64(len(data)) && len(file.Tensors) > 0 {
			t.Fatalf("data offset %d past %d bytes", file.DataOffset, len(data))
		}
		for _, ti := range file.Tensors {
			if ti.Size() < 0 || file.DataOffset+int64(ti.Offset)+ti.Size() > int64(len(data)) {
				t.Fatalf("tensor %s out of range", ti.Name)
			}
		}
		// Re-encoding what was read gives the same header bytes.
		specs := make([]TensorSpec, len(file.Tensors))
		for i, ti := range file.Tensors {
			specs[i] = TensorSpec{ti.Name, ti.Dims, ti.Type}
		}
		l, err := PlanLayout(file.KVs, specs, file.Alignment)
		if err != nil {
			if ti := file.Tensors; len(ti) > 0 && ti[0].Name == "" {
				return // the writer refuses empty names the reader accepts
			}
			t.Fatalf("re-encode: %v", err)
		}
		if int64(len(l.Header)) != file.DataOffset || !bytes.Equal(l.Header[:file.HeaderRead], data[:file.HeaderRead]) {
			t.Fatalf("re-encoded header differs")
		}
	})
}
