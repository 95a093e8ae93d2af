package gguf

import (
	"bytes"
	"os"
	"path/filepath"
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

// FuzzSplit feeds arbitrary bytes as the two parts of a split to Open: it
// must never panic, and a split it accepts must read every tensor within
// its parts.
func FuzzSplit(f *testing.F) {
	// A valid split of two parts, and the reference's Q4_K_M parts cut short.
	specs := []TensorSpec{{"a", []uint64{32, 2}, quant.Q8_0}, {"b", []uint64{8}, quant.F32}}
	l, err := PlanLayout([]KV{Str("general.architecture", "x")}, specs, 0)
	if err != nil {
		f.Fatal(err)
	}
	sl, err := l.WithSplit([]KV{Str("general.architecture", "x")}, SplitOptions{MaxTensors: 1})
	if err != nil {
		f.Fatal(err)
	}
	seed := func(pl *Layout) []byte {
		return append(append([]byte(nil), pl.Header...), make([]byte, pl.Size-int64(len(pl.Header)))...)
	}
	f.Add(seed(sl.Split.Parts[0]), seed(sl.Split.Parts[1]))
	a, _ := os.ReadFile("testdata/split/base-Q4_K_M-t20-00001-of-00004.gguf")
	b, _ := os.ReadFile("testdata/split/base-Q4_K_M-t20-00002-of-00004.gguf")
	f.Add(a[:min(len(a), 16<<10)], b[:min(len(b), 4<<10)])
	dir := f.TempDir()
	p1, p2 := filepath.Join(dir, SplitName("x", 0, 2)), filepath.Join(dir, SplitName("x", 1, 2))
	f.Fuzz(func(t *testing.T, one, two []byte) {
		if os.WriteFile(p1, one, 0o644) != nil || os.WriteFile(p2, two, 0o644) != nil {
			t.Skip("cannot write the parts")
		}
		file, err := Open(p1)
		if err != nil {
			return
		}
		defer file.Close()
		for _, ti := range file.Tensors {
			path, off := file.Locate(ti)
			st, err := os.Stat(path)
			if err != nil || off < 0 || off+ti.Size() > st.Size() {
				t.Fatalf("tensor %s located at %s:%d (%v), past the part", ti.Name, path, off, err)
			}
			buf := make([]byte, ti.Size())
			if _, err := file.Section(ti).ReadAt(buf, 0); err != nil && ti.Size() > 0 {
				t.Fatalf("tensor %s: %v", ti.Name, err)
			}
		}
	})
}
