package quantize

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// benchInput writes (once per process and layer count) a Qwen3.5-27B-width
// F16 GGUF (testmodel.Wide27B: layers trunk blocks at the real widths, an
// MTP block, a 32768 vocabulary), streamed. FERRY_BENCH_LAYERS sets the
// trunk blocks (default 1: 2.2 GB; each more adds 0.75 GB),
// FERRY_BENCH_VOCAB the vocabulary (248320 is Qwen3.5's: 5.1 GB of
// token_embd and output); FERRY_BENCH_DIR keeps the file between runs.
func benchInput(b *testing.B) string {
	o := testmodel.Wide27B(benchtest.EnvInt(b, "FERRY_BENCH_LAYERS", 1))
	o.Vocab = benchtest.EnvInt(b, "FERRY_BENCH_VOCAB", o.Vocab)
	p := filepath.Join(benchtest.Dir(b), fmt.Sprintf("wide27b-%d-%d-F16.gguf", o.Layers, o.Vocab))
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if _, err := o.WriteGGUF(p); err != nil {
		b.Fatal(err)
	}
	return p
}

func TestMain(m *testing.M) { benchtest.Main(m) }

// sha256File is the hex sha256 of the file at p.
func sha256File(b *testing.B, p string) string {
	d, _, err := hashing.File(context.Background(), p, nil)
	if err != nil {
		b.Fatal(err)
	}
	return d.Hex()
}

// BenchmarkQuantize quantizes the generated Qwen3.5-27B-width F16 GGUF
// (benchInput) in a child process, as `ferry quantize` does (journal,
// fsync, rename), to FERRY_BENCH_QTYPE (default Q4_K_M) with
// FERRY_BENCH_JOBS workers (default all cores). Reported: MB/s of input,
// the child's peak RSS, and, when FERRY_LLAMA_QUANTIZE names a
// llama-quantize binary, the same quantization by it in the same run at
// the same thread count: its seconds and peak RSS, x-llama-quantize (its
// time over ours: above 1 ferry is faster) and identical (1 when the two
// files have the same sha256; the benchmark fails when they differ).
// FERRY_BENCH_CPUPROFILE=FILE writes the measured child's CPU profile.
func BenchmarkQuantize(b *testing.B) {
	in := benchInput(b)
	st, err := os.Stat(in)
	if err != nil {
		b.Fatal(err)
	}
	typ := os.Getenv("FERRY_BENCH_QTYPE")
	if typ == "" {
		typ = "Q4_K_M"
	}
	jobs := runtime.NumCPU()
	if s := os.Getenv("FERRY_BENCH_JOBS"); s != "" {
		if jobs, err = strconv.Atoi(s); err != nil || jobs < 1 {
			b.Fatalf("FERRY_BENCH_JOBS=%q", s)
		}
	}
	llama := os.Getenv("FERRY_LLAMA_QUANTIZE")
	work := b.TempDir()
	// Warm the page cache as the gguf stage before it would leave it.
	benchtest.Run(b, nil, "cat", in)
	b.SetBytes(st.Size())
	b.ResetTimer()
	var ours, theirs time.Duration
	var rss, llamaRSS int64
	identical := 1.0
	for range b.N {
		out := filepath.Join(work, "out.gguf")
		m := benchtest.Run(b, []string{"FERRY_QUANTIZE_CHILD=" + in + ":" + out + ":" + typ + ":" + strconv.Itoa(jobs)}, os.Args[0], "-test.run=^$")
		ours += m.Wall
		rss = max(rss, m.PeakRSS)
		if llama != "" {
			ref := filepath.Join(work, "llama.gguf")
			m := benchtest.Run(b, nil, llama, in, ref, typ, strconv.Itoa(jobs))
			theirs += m.Wall
			llamaRSS = max(llamaRSS, m.PeakRSS)
			b.StopTimer()
			if sha256File(b, out) != sha256File(b, ref) {
				identical = 0
				b.Errorf("ferry's %s differs from llama-quantize's", typ)
			}
			b.StartTimer()
			os.Remove(ref)
		}
		os.Remove(out)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(st.Size())/1e6/(ours.Seconds()/n), "MB/s")
	b.ReportMetric(float64(rss)/(1<<20), "peakRSS-MiB")
	b.ReportMetric(ours.Seconds()/n, "ferry-s")
	msg := fmt.Sprintf("input %d bytes → %s, %d jobs: ferry %.2fs, peak RSS %.0f MiB", st.Size(), typ, jobs, ours.Seconds()/n, float64(rss)/(1<<20))
	if llama != "" {
		b.ReportMetric(theirs.Seconds()/n, "llama-quantize-s")
		b.ReportMetric(float64(llamaRSS)/(1<<20), "llama-peakRSS-MiB")
		b.ReportMetric(theirs.Seconds()/ours.Seconds(), "x-llama-quantize")
		b.ReportMetric(identical, "identical")
		msg += fmt.Sprintf("; llama-quantize %.2fs, peak RSS %.0f MiB; same bytes: %v", theirs.Seconds()/n, float64(llamaRSS)/(1<<20), identical == 1)
	}
	b.Log(msg)
}

// BenchmarkQuantizeLadder makes FERRY_BENCH_LADDER (default
// Q6_K,Q4_K_M,Q2_K) from the generated Qwen3.5-27B-width F16 GGUF
// (benchInput, ≥ 2 GB) two ways, each in child processes as `ferry
// quantize` runs them: one run that reads the input once and writes every
// type (--type … --out-dir, its errors measured for the quality table),
// and one run per type. Reported: each way's seconds and peak RSS,
// x-one-run (the ladder's time over the mean time of a single-type run:
// the target is at most 1.6) and x-separate (the separate runs'
// total over the ladder's: above 1 the ladder is faster). The benchmark
// fails when a ladder output differs from its single-type run's.
func BenchmarkQuantizeLadder(b *testing.B) {
	in := benchInput(b)
	st, err := os.Stat(in)
	if err != nil {
		b.Fatal(err)
	}
	types := os.Getenv("FERRY_BENCH_LADDER")
	if types == "" {
		types = "Q6_K,Q4_K_M,Q2_K"
	}
	names := strings.Split(types, ",")
	if len(names) < 2 {
		b.Fatalf("FERRY_BENCH_LADDER=%q: want two types or more", types)
	}
	jobs := strconv.Itoa(runtime.NumCPU())
	if s := os.Getenv("FERRY_BENCH_JOBS"); s != "" {
		jobs = s
	}
	work := b.TempDir()
	benchtest.Run(b, nil, "cat", in) // warm the page cache
	b.SetBytes(st.Size())
	b.ResetTimer()
	var ladder, separate time.Duration
	var ladderRSS, separateRSS int64
	for range b.N {
		dir := filepath.Join(work, "ladder")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		m := benchtest.Run(b, []string{"FERRY_QUANTIZE_CHILD=" + in + ":" + dir + ":" + types + ":" + jobs}, os.Args[0], "-test.run=^$")
		ladder += m.Wall
		ladderRSS = max(ladderRSS, m.PeakRSS)
		b.Logf("one read, %s: %.2fs, CPU %.2fs (%.1f cores busy)", types, m.Wall.Seconds(), m.CPU.Seconds(), m.CPU.Seconds()/m.Wall.Seconds())
		for _, ty := range names {
			out := filepath.Join(work, "single.gguf")
			m := benchtest.Run(b, []string{"FERRY_QUANTIZE_CHILD=" + in + ":" + out + ":" + ty + ":" + jobs}, os.Args[0], "-test.run=^$")
			separate += m.Wall
			separateRSS = max(separateRSS, m.PeakRSS)
			b.Logf("single run, %s: %.2fs, CPU %.2fs (%.1f cores busy)", ty, m.Wall.Seconds(), m.CPU.Seconds(), m.CPU.Seconds()/m.Wall.Seconds())
			b.StopTimer()
			ft, err := ParseType(ty)
			if err != nil {
				b.Fatal(err)
			}
			lo := filepath.Join(dir, OutputName(Stem(in), ft))
			if sha256File(b, lo) != sha256File(b, out) {
				b.Errorf("the ladder's %s differs from a single-type run's", ty)
			}
			os.Remove(out)
			os.Remove(lo)
			b.StartTimer()
		}
	}
	b.StopTimer()
	n := float64(b.N)
	one := separate.Seconds() / n / float64(len(names))
	b.ReportMetric(ladder.Seconds()/n, "ladder-s")
	b.ReportMetric(separate.Seconds()/n, "separate-s")
	b.ReportMetric(float64(ladderRSS)/(1<<20), "ladder-peakRSS-MiB")
	b.ReportMetric(float64(separateRSS)/(1<<20), "separate-peakRSS-MiB")
	b.ReportMetric(ladder.Seconds()/n/one, "x-one-run")
	b.ReportMetric(separate.Seconds()/ladder.Seconds(), "x-separate")
	b.Logf("input %d bytes → %s, %s jobs: one read %.2fs (peak RSS %.0f MiB); separate runs %.2fs in all, %.2fs each on average (peak RSS %.0f MiB); one read / one run = %.2f",
		st.Size(), types, jobs, ladder.Seconds()/n, float64(ladderRSS)/(1<<20), separate.Seconds()/n, one, float64(separateRSS)/(1<<20), ladder.Seconds()/n/one)
}
