package convert

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// Plan.ReaderAt reads the bytes Write writes: read whole, and in ranges
// of every kind (inside the header, across header and data, mid-row,
// across tensors and their padding, past the end), for a plain model and
// for Qwen3.5 with its transformed tensors (row reorders, +1, -exp) and
// MTP block.
func TestReaderAtIsWrite(t *testing.T) {
	for _, dir := range []string{qwen3Dir, qwen35Dir} {
		t.Run(filepath.Base(filepath.Dir(dir)), func(t *testing.T) {
			p := planDir(t, dir)
			out := filepath.Join(t.TempDir(), "out.gguf")
			if err := Write(context.Background(), p, out, WriteOptions{Jobs: 2}); err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			r := p.ReaderAt()
			got := make([]byte, len(want))
			if n, err := r.ReadAt(got, 0); n != len(want) || err != nil {
				t.Fatalf("whole file: %d bytes, %v", n, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the whole file read differs from Write's")
			}
			rng := rand.New(rand.NewPCG(1, 2))
			size := int64(len(want))
			for range 300 {
				off := rng.Int64N(size)
				n := 1 + rng.Int64N(min(size-off, 70000))
				b := make([]byte, n)
				if m, err := r.ReadAt(b, off); m != int(n) || err != nil {
					t.Fatalf("[%d, %d): %d bytes, %v", off, off+n, m, err)
				}
				if !bytes.Equal(b, want[off:off+n]) {
					t.Fatalf("[%d, %d) differs from Write's bytes", off, off+n)
				}
			}
			b := make([]byte, 10)
			if m, err := r.ReadAt(b, size-4); m != 4 || err != io.EOF || !bytes.Equal(b[:4], want[size-4:]) {
				t.Errorf("read across the end: %d bytes, %v", m, err)
			}
		})
	}
}

// planDir plans the default conversion of the checkpoint dir, open until
// the test ends.
func planDir(t *testing.T, dir string) *Plan {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	p, err := NewPlan(ck, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
