package manifest

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

const benchSize = 64 << 20

func benchData() []byte {
	b := make([]byte, benchSize)
	rand.NewChaCha8([32]byte{1}).Read(b)
	return b
}

// BenchmarkIngest measures the ingest writer (hash while writing, fsync,
// rename, fsync dir) against the anchor measured in the same run: a plain
// copy to a file with fsync (Anchor). Compare the MB/s of the two.
func BenchmarkIngest(b *testing.B) {
	data := benchData()
	b.Run("Anchor", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(benchSize)
		for i := 0; i < b.N; i++ {
			f, err := os.Create(filepath.Join(dir, "copy"))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("Store", func(b *testing.B) {
		s, err := Open(filepath.Join(b.TempDir(), "s"))
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchSize)
		for i := 0; i < b.N; i++ {
			data[0] = byte(i) // a new blob each time, not a dedup hit
			if _, _, err := s.Ingest(bytes.NewReader(data), benchSize); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkJournal writes one output in 1 MiB journaled units (fsync of the
// data and a journal line per unit), against the same anchor.
func BenchmarkJournal(b *testing.B) {
	data := benchData()
	s, err := Open(filepath.Join(b.TempDir(), "s"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchSize)
	for i := 0; i < b.N; i++ {
		data[0] = byte(i)
		j, err := s.OpenJournal("bench", "out.bin")
		if err != nil {
			b.Fatal(err)
		}
		for off := 0; off < benchSize; off += 1 << 20 {
			j.Write(data[off : off+1<<20])
			if err := j.EndUnit("u"); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := j.Commit(benchSize); err != nil {
			b.Fatal(err)
		}
		j.Close()
		s.RemoveIngest("bench")
	}
}
