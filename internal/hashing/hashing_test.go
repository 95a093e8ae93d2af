package hashing

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// A sparse file with data scattered through holes: every section's digest
// must equal sha256 of its bytes read plainly, for any worker count.
func TestSectionsSparse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 96 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 40 {
		b := make([]byte, rng.IntN(3*ChunkSize))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if _, err := f.WriteAt(b, rng.Int64N(size-int64(len(b)))); err != nil {
			t.Fatal(err)
		}
	}
	// Ranges: empty, tiny, chunk-aligned, straddling chunks, the whole file.
	bounds := [][2]int64{{0, 0}, {5, 17}, {0, ChunkSize}, {ChunkSize - 3, 3*ChunkSize + 11}, {0, size}, {size - 1, size}}
	for range 20 {
		a := rng.Int64N(size)
		bounds = append(bounds, [2]int64{a, a + rng.Int64N(size-a)})
	}
	var secs []Section
	var want []Digest
	for _, b := range bounds {
		s := io.NewSectionReader(f, b[0], b[1]-b[0])
		secs = append(secs, s)
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(f, b[0], b[1]-b[0])); err != nil {
			t.Fatal(err)
		}
		want = append(want, Digest(h.Sum(nil)))
	}
	for _, jobs := range []int{0, 1, 3, 64} {
		var seen atomic.Int64
		got, err := Sections(context.Background(), secs, jobs, func(n int64) { seen.Add(n) })
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("jobs %d: section %v: digest differs", jobs, bounds[i])
			}
		}
		var total int64
		for _, s := range secs {
			total += s.Size()
		}
		if seen.Load() != total {
			t.Errorf("jobs %d: progress reported %d of %d bytes", jobs, seen.Load(), total)
		}
	}
}

func TestSectionsErrors(t *testing.T) {
	short := io.NewSectionReader(bytes.NewReader(make([]byte, 10)), 0, 20)
	if _, err := Sections(context.Background(), []Section{short}, 2, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("short section: %v", err)
	}
	// A short read names the section and the offset where the bytes ran out
	// (past the first chunk here), whatever the worker count.
	ok := io.NewSectionReader(bytes.NewReader(make([]byte, 64)), 0, 64)
	long := io.NewSectionReader(bytes.NewReader(make([]byte, ChunkSize+5)), 0, 2*ChunkSize)
	for _, jobs := range []int{1, 3} {
		_, err := Sections(context.Background(), []Section{ok, long, ok}, jobs, nil)
		var se *SectionError
		if !errors.As(err, &se) || se.Index != 1 || se.Offset != ChunkSize+5 || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("jobs %d: short second section: %#v (%v), want index 1 offset %d", jobs, se, err, ChunkSize+5)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	big := io.NewSectionReader(bytes.NewReader(make([]byte, 4*ChunkSize)), 0, 4*ChunkSize)
	if _, err := Sections(ctx, []Section{big}, 1, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if d, err := Sections(context.Background(), nil, 4, nil); err != nil || len(d) != 0 {
		t.Errorf("no sections: %v %v", d, err)
	}
}

// sparseFile makes a warm sparse file of size bytes: created, truncated,
// and read once so the timed loops find it in the page cache, like the
// warm-cache reference anchors.
func sparseFile(b *testing.B, size int64) *os.File {
	p := filepath.Join(b.TempDir(), "sparse")
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, io.NewSectionReader(f, 0, size)); err != nil {
		b.Fatal(err)
	}
	return f
}

// BenchmarkSectionsSparse hashes 1 GiB of a warm sparse file on one
// worker: the per-core hashing rate (pread + sha256).
func BenchmarkSectionsSparse(b *testing.B) {
	const size = 1 << 30
	f := sparseFile(b, size)
	secs := []Section{io.NewSectionReader(f, 0, size)}
	b.SetBytes(size)
	for b.Loop() {
		if _, err := Sections(context.Background(), secs, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChunkSize is the sweep behind ChunkSize: the same 1 GiB hashed
// with read buffers of several sizes, beside the in-memory sha256 anchor.
func BenchmarkChunkSize(b *testing.B) {
	const size = 1 << 30
	f := sparseFile(b, size)
	for _, chunk := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", chunk>>10), func(b *testing.B) {
			buf := make([]byte, chunk)
			s := io.NewSectionReader(f, 0, size)
			b.SetBytes(size)
			for b.Loop() {
				if _, err := hashOne(context.Background(), s, buf, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("anchor-sha256-memory", func(b *testing.B) {
		buf := make([]byte, 1<<20)
		b.SetBytes(int64(len(buf)))
		h := sha256.New()
		for b.Loop() {
			h.Write(buf)
		}
	})
}
