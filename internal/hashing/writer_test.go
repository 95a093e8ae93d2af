package hashing

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// failAfter accepts n bytes, then fails.
type failAfter struct {
	n   int
	got bytes.Buffer
}

var errFull = errors.New("full")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		f.got.Write(p[:f.n])
		k := f.n
		f.n = 0
		return k, errFull
	}
	f.n -= len(p)
	return f.got.Write(p)
}

// TestWriter: the digest names exactly the bytes the destination accepted,
// and a write resumed from a saved state ends with the digest of an
// uninterrupted one.
func TestWriter(t *testing.T) {
	data := bytes.Repeat([]byte("ferry-hashing-"), 10000)
	for _, tc := range []struct {
		name   string
		accept int // bytes the destination takes before failing (-1: all)
		cut    int // where the state is saved and the write resumed
	}{
		{"whole", -1, 0},
		{"resumed mid-stream", -1, 4099},
		{"resumed at the end", -1, len(data)},
		{"short destination", 777, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dst interface {
				Write([]byte) (int, error)
			}
			var got *bytes.Buffer
			if tc.accept >= 0 {
				f := &failAfter{n: tc.accept}
				dst, got = f, &f.got
			} else {
				got = &bytes.Buffer{}
				dst = got
			}
			w := NewWriter(dst)
			_, err := w.Write(data[:tc.cut])
			if err == nil {
				w, err = Resume(dst, w.State(), w.Size())
				if err != nil {
					t.Fatal(err)
				}
				_, err = w.Write(data[tc.cut:])
			}
			if tc.accept >= 0 && !errors.Is(err, errFull) {
				t.Fatalf("err %v, want errFull", err)
			}
			if tc.accept < 0 && err != nil {
				t.Fatal(err)
			}
			if want := sha256.Sum256(got.Bytes()); w.Sum() != Digest(want) || w.Size() != int64(got.Len()) {
				t.Errorf("digest %s over %d bytes, destination holds %d bytes hashing to %x", w.Sum().Hex(), w.Size(), got.Len(), want)
			}
		})
	}
	if _, err := Resume(nil, []byte("short"), 5); !errors.Is(err, ErrBadState) {
		t.Errorf("bad state: %v", err)
	}
}

func TestFile(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{0, 1, ChunkSize, 3*ChunkSize + 5} {
		p := filepath.Join(dir, "f")
		b := bytes.Repeat([]byte{byte(n)}, n)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		var seen int64
		d, size, err := File(t.Context(), p, func(k int64) { seen += k })
		if err != nil || d != Digest(sha256.Sum256(b)) || size != int64(n) || seen != int64(n) {
			t.Errorf("%d bytes: %s %d (progress %d) %v", n, d.Hex(), size, seen, err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := File(ctx, filepath.Join(dir, "f"), nil); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	if _, _, err := File(t.Context(), filepath.Join(dir, "missing"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}
