package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// A Writer fsyncs the file and its directory before it is done; with
// Options.NoSync it never does, and writes the same bytes.
func TestWriterNoSync(t *testing.T) {
	l, err := PlanLayout([]KV{{Key: "general.architecture", Type: ValueString, Value: "llama"}},
		[]TensorSpec{{Name: "a", Dims: []uint64{64, 3}, Type: quant.F32}, {Name: "b", Dims: []uint64{32}, Type: quant.F16}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var files [][]byte
	for _, tc := range []struct {
		name   string
		noSync bool
	}{{"synced", false}, {"no-sync", true}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "m.gguf")
			w, err := Create(path, l, Options{NoSync: tc.noSync})
			if err != nil {
				t.Fatal(err)
			}
			for i, ti := range l.Tensors {
				body := bytes.Repeat([]byte{byte(i + 1)}, int(ti.Size()))
				if err := w.WriteTensorBytes(i, body); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got, want := w.syncs.Load(), int32(3) // Sync, Close's file and directory
			if tc.noSync {
				want = 0
			}
			if got != want {
				t.Errorf("%d fsyncs, want %d", got, want)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, b)
		})
	}
	if len(files) == 2 && !bytes.Equal(files[0], files[1]) {
		t.Error("the files written with and without fsync differ")
	}
}
