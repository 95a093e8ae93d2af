package s3_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	s3store "github.com/ferry-llm/ferry/store/s3"
)

// BenchmarkBlob stores a blob on a versitygw on this machine (multipart,
// 16 MiB parts, 4, 8 or 16 in flight: the sub-benchmarks) and fetches it
// back verified, each iteration into a new prefix. It reports MB/s of each
// (the time per op is both), the seconds the completion took (a gateway
// on a file system joins the parts by copying them) and the Go heap in use
// at its peak (sampled after each part), the bound the part size and
// parallelism set. The blob is 256 MiB, or FERRY_BENCH_BLOB_MB;
// FERRY_S3TEST_DIR puts the gateway's objects elsewhere (a tmpfs).
func BenchmarkBlob(b *testing.B) {
	srv := s3test.Start(b, "ferry-bench")
	srv.Env(b)
	size := int64(256 << 20)
	if mb, err := strconv.Atoi(os.Getenv("FERRY_BENCH_BLOB_MB")); err == nil && mb > 0 {
		size = int64(mb) << 20
	}
	src := filepath.Join(b.TempDir(), "blob")
	f, err := os.Create(src)
	if err != nil {
		b.Fatal(err)
	}
	r := mrand.NewChaCha8([32]byte{1})
	buf := make([]byte, 16<<20)
	for range size / int64(len(buf)) {
		r.Read(buf)
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
	for _, par := range []int{4, 8, 16} {
		b.Run(fmt.Sprintf("parallel=%d", par), func(b *testing.B) {
			var peak uint64
			var up, down, complete time.Duration
			sample := func(int64) {
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				peak = max(peak, m.HeapInuse)
			}
			b.SetBytes(size)
			for i := range b.N {
				be, err := s3store.Open(ctx, fmt.Sprintf("s3://ferry-bench/p%d-i%d", par, i))
				if err != nil {
					b.Fatal(err)
				}
				tb := &timedComplete{Backend: be}
				s, err := store.Open(ctx, tb, store.Options{CacheDir: b.TempDir(), Parallel: par})
				if err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := s.PutKnownFile(ctx, d, src, func() error { return nil }, sample); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				dst := filepath.Join(b.TempDir(), "out")
				if err := s.FetchBlob(ctx, d, dst, sample); err != nil {
					b.Fatal(err)
				}
				up += t1.Sub(t0)
				complete += tb.took
				down += time.Since(t1)
				os.Remove(dst)
				os.RemoveAll(srv.ObjectPath("ferry-bench", fmt.Sprintf("p%d-i%d", par, i)))
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
			b.ReportMetric(float64(size)*float64(b.N)/up.Seconds()/1e6, "upload-MB/s")
			b.ReportMetric(float64(size)*float64(b.N)/down.Seconds()/1e6, "fetch-MB/s")
			b.ReportMetric(complete.Seconds()/float64(b.N), "complete-s")
		})
	}
}

// timedComplete times a backend's CompleteUpload.
type timedComplete struct {
	store.Backend
	took time.Duration
}

func (t *timedComplete) CompleteUpload(ctx context.Context, key, id string, parts []store.Part, opt store.PutOptions) (store.Info, error) {
	t0 := time.Now()
	in, err := t.Backend.CompleteUpload(ctx, key, id, parts, opt)
	t.took += time.Since(t0)
	return in, err
}
