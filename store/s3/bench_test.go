package s3_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// BenchmarkBlob stores a 256 MiB blob on a versitygw on this machine
// (multipart, 16 MiB parts, 4 in flight) and fetches it back verified,
// each iteration into a new prefix; it reports MB/s of each (the time
// per op is both) and the Go
// heap in use at its peak (sampled after each part), the bound the part
// size and parallelism set.
func BenchmarkBlob(b *testing.B) {
	srv := s3test.Start(b, "ferry-bench")
	srv.Env(b)
	const size = 256 << 20
	src := filepath.Join(b.TempDir(), "blob")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 16<<20)
	for range size / len(buf) {
		rand.Read(buf)
		f.Write(buf)
	}
	f.Close()
	buf = nil
	dg, _, err := hashing.File(context.Background(), src, nil)
	if err != nil {
		b.Fatal(err)
	}
	d := digest.New(dg[:])
	ctx := context.Background()
	var peak uint64
	var up, down time.Duration
	sample := func(int64) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		peak = max(peak, m.HeapInuse)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		be, err := s3store.Open(ctx, fmt.Sprintf("s3://ferry-bench/i%d", i))
		if err != nil {
			b.Fatal(err)
		}
		s, err := store.Open(ctx, be, store.Options{CacheDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := s.PutFile(ctx, d, src, sample); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		dst := filepath.Join(b.TempDir(), "out")
		if err := s.FetchBlob(ctx, d, dst, sample); err != nil {
			b.Fatal(err)
		}
		up += t1.Sub(t0)
		down += time.Since(t1)
		os.Remove(dst)
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	b.ReportMetric(float64(size)*float64(b.N)/up.Seconds()/1e6, "upload-MB/s")
	b.ReportMetric(float64(size)*float64(b.N)/down.Seconds()/1e6, "fetch-MB/s")
}
