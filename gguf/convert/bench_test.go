package convert

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/safetensors"
)

// The test binary doubles as a converter: with FERRY_CONVERT_CHILD=DIR:OUT
// it converts DIR to OUT (F16) as the CLI does (journal, resume; with
// FERRY_CONVERT_NOSYNC=1 as `--no-sync` does) and exits,
// so the benchmark measures a
// separate process's wall time and peak RSS. It writes to OUT+".times"
// how long the final fsync, rename and directory sync took after the last
// tensor byte was written (seconds), so the parent can tell the time to
// get the bytes into the page cache (what cp measures) from the time to
// get them onto the disk.
func init() {
	spec := os.Getenv("FERRY_CONVERT_CHILD")
	if spec == "" {
		return
	}
	dir, out, _ := strings.Cut(spec, ":")
	ck, err := safetensors.OpenDir(dir)
	if err == nil {
		var p *Plan
		if p, err = NewPlan(ck, Options{OutType: OutF16}); err == nil {
			// As `ferry gguf convert` runs it: resumable, with a journal.
			var mu sync.Mutex
			var last time.Time
			_, err = Run(context.Background(), ck, p, out, RunOptions{NoSync: os.Getenv("FERRY_CONVERT_NOSYNC") == "1", TensorDone: func(int, string) {
				mu.Lock()
				last = time.Now()
				mu.Unlock()
			}})
			if err == nil {
				err = os.WriteFile(out+".times", []byte(fmt.Sprint(time.Since(last).Seconds())), 0o644)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// benchCheckpoint is a Qwen3.5-27B-width checkpoint (benchtest.Checkpoint27B):
// 4 layers (3 linear-attention + 1 full) + 1 MTP layer at the real widths,
// vocab 32768 (the 248320 vocabulary would add 5 GB of embeddings), BF16,
// 2 GB shards, with a tokenizer. FERRY_BENCH_LAYERS sets the layer count
// (default 4: 4.56 GB; 12: 10.65 GB, more than the kernel's default
// dirty-page limit on a 24 GiB machine); FERRY_BENCH_DIR keeps it between
// runs.
func benchCheckpoint(b *testing.B) benchtest.Checkpoint {
	return benchtest.Checkpoint27B(b, benchtest.EnvInt(b, "FERRY_BENCH_LAYERS", 4), 32768, true)
}

func TestMain(m *testing.M) { benchtest.Main(m) }

// BenchmarkConvertQwen35F16 converts a ≥ 2 GB Qwen3.5-shaped BF16
// checkpoint to GGUF F16 in a child process (all cores) and, in the same
// run, copies the same shard bytes with cp, then with cp + fsync (the
// converter fsyncs its output before the rename), then with `cat shards >
// file` (one output file, plain read/write). Reported: MB/s of input,
// peak RSS of the converter process, the time ratios to the copies
// (x-cp, x-cp+fsync, x-cat), and x-cp-written: the converter's time until its last
// byte is in the page cache, before the final fsync waits for the disk,
// over cp's (which never waits for the disk): the like-for-like ratio.
// The converter also runs with --no-sync (written to the page cache as cp
// writes, no fsync): nosync-s, x-cp-nosync and x-cat-nosync.
func BenchmarkConvertQwen35F16(b *testing.B) {
	ck := benchCheckpoint(b)
	dir, shards, in := ck.Dir, ck.Shards, ck.Bytes
	if in < 2e9 {
		b.Fatalf("checkpoint is %d bytes, want ≥ 2 GB", in)
	}
	work := b.TempDir()
	// Warm the page cache as a previous pipeline stage would leave it.
	benchtest.Run(b, nil, "cat", shards...)
	b.SetBytes(in)
	b.ResetTimer()
	var conv, convTail, noSync, cp, cpSync, cat time.Duration
	var rss int64
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(work, "cp")
		os.MkdirAll(dst, 0o755)
		d := benchtest.Run(b, nil, "cp", append(append([]string{}, shards...), dst)...).Wall
		cp += d
		os.RemoveAll(dst)
		os.MkdirAll(dst, 0o755)
		var synced []string
		for _, s := range shards {
			synced = append(synced, filepath.Join(dst, filepath.Base(s)))
		}
		d1 := benchtest.Run(b, nil, "cp", append(append([]string{}, shards...), dst)...).Wall
		d2 := benchtest.Run(b, nil, "sync", synced...).Wall
		cpSync += d1 + d2
		os.RemoveAll(dst)
		// cat > file: every shard's bytes into one output file, as the
		// converter writes one GGUF (cp may clone or copy_file_range).
		catOut := filepath.Join(work, "cat.out")
		d = benchtest.Run(b, nil, "sh", append([]string{"-c", `out="$1"; shift; cat "$@" > "$out"`, "sh", catOut}, shards...)...).Wall
		cat += d
		os.Remove(catOut)

		out := filepath.Join(work, "out.gguf")
		child := benchtest.Run(b, []string{"FERRY_CONVERT_CHILD=" + dir + ":" + out}, os.Args[0], "-test.run=^$")
		d = child.Wall
		conv += d
		rss = max(rss, child.PeakRSS)
		tail, err := os.ReadFile(out + ".times")
		if err != nil {
			b.Fatal(err)
		}
		f, err := strconv.ParseFloat(string(tail), 64)
		if err != nil || f < 0 || f > d.Seconds() {
			b.Fatalf("%s.times: %q: want the seconds after the last write, at most %v", out, tail, d)
		}
		convTail += time.Duration(f * float64(time.Second))
		os.Remove(out)
		os.Remove(out + ".times")

		child = benchtest.Run(b, []string{"FERRY_CONVERT_CHILD=" + dir + ":" + out, "FERRY_CONVERT_NOSYNC=1"}, os.Args[0], "-test.run=^$")
		noSync += child.Wall
		rss = max(rss, child.PeakRSS)
		os.Remove(out)
		os.Remove(out + ".times")
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(in)/1e6/(conv.Seconds()/n), "MB/s")
	b.ReportMetric(float64(rss)/(1<<20), "peakRSS-MiB")
	written := conv - convTail
	b.ReportMetric(conv.Seconds()/cp.Seconds(), "x-cp")
	b.ReportMetric(written.Seconds()/cp.Seconds(), "x-cp-written")
	b.ReportMetric(conv.Seconds()/cpSync.Seconds(), "x-cp+fsync")
	b.ReportMetric(conv.Seconds()/cat.Seconds(), "x-cat")
	b.ReportMetric(written.Seconds()/cat.Seconds(), "x-cat-written")
	b.ReportMetric(cat.Seconds()/n, "cat-s")
	b.ReportMetric(cp.Seconds()/n, "cp-s")
	b.ReportMetric(cpSync.Seconds()/n, "cp+fsync-s")
	b.ReportMetric(conv.Seconds()/n, "convert-s")
	b.ReportMetric(written.Seconds()/n, "written-s")
	b.ReportMetric(noSync.Seconds()/n, "nosync-s")
	b.ReportMetric(noSync.Seconds()/cp.Seconds(), "x-cp-nosync")
	b.ReportMetric(noSync.Seconds()/cat.Seconds(), "x-cat-nosync")
	b.Logf("input %d bytes; convert %.2fs (last byte written at %.2fs, then fsync+rename), --no-sync %.2fs, cp %.2fs, cp+fsync %.2fs, cat > file %.2fs, peak RSS %.0f MiB",
		in, conv.Seconds()/n, written.Seconds()/n, noSync.Seconds()/n, cp.Seconds()/n, cpSync.Seconds()/n, cat.Seconds()/n, float64(rss)/(1<<20))
}

// BenchmarkConvertSmall is the in-process conversion of the bundled
// Qwen3.5 reference checkpoint (7 MB), for quick regressions.
func BenchmarkConvertSmall(b *testing.B) {
	ck, err := safetensors.OpenDir(qwen35Dir)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	b.SetBytes(ck.TotalBytes())
	out := filepath.Join(b.TempDir(), "o.gguf")
	for i := 0; i < b.N; i++ {
		p, err := NewPlan(ck, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := Write(context.Background(), p, out, WriteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConvertHashed is the conversion the pipeline's gguf stage runs,
// which needs the output's sha256 for the manifest: "follow" hashes while
// writing (WriteOptions.Digest), "after" converts and then reads the file
// back to hash it (what the stage did before). Same checkpoint as
// BenchmarkConvertQwen35F16, in process.
func BenchmarkConvertHashed(b *testing.B) {
	ck, err := safetensors.OpenDir(benchCheckpoint(b).Dir)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	p, err := NewPlan(ck, Options{OutType: OutF16})
	if err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(b.TempDir(), "out.gguf")
	for _, mode := range []string{"follow", "after"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(ck.TotalBytes())
			for i := 0; i < b.N; i++ {
				var sum []byte
				wo := WriteOptions{}
				if mode == "follow" {
					wo.Digest = func(s []byte) { sum = s }
				}
				if err := Write(context.Background(), p, out, wo); err != nil {
					b.Fatal(err)
				}
				if mode == "after" {
					f, err := os.Open(out)
					if err != nil {
						b.Fatal(err)
					}
					h := sha256.New()
					if _, err := io.Copy(h, f); err != nil {
						b.Fatal(err)
					}
					f.Close()
					sum = h.Sum(nil)
				}
				if len(sum) != sha256.Size {
					b.Fatal("no digest")
				}
				os.Remove(out)
			}
		})
	}
}
