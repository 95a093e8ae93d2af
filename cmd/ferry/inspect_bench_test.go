package main

import (
	"crypto/sha256"
	"encoding/json"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/inspect"
	"github.com/ferry-llm/ferry/internal/sysmem"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// writeSparse writes a safetensors file of n BF16 tensors of rows×cols as
// a header followed by a hole (the kernel returns zeros), with a few
// random bytes scattered in when scatter is set, so hashes are not all of
// zeros.
func writeSparse(tb testing.TB, path string, n int, rows, cols int64, scatter bool) int64 {
	tb.Helper()
	specs := make([]safetensors.TensorSpec, n)
	for i := range specs {
		specs[i] = safetensors.TensorSpec{Name: "t" + string(rune('a'+i)), DType: tensor.BF16, Shape: []int64{rows, cols}}
	}
	hdr, infos, err := safetensors.EncodeHeader(nil, specs)
	if err != nil {
		tb.Fatal(err)
	}
	data := infos[len(infos)-1].End
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(hdr); err != nil {
		tb.Fatal(err)
	}
	if err := f.Truncate(int64(len(hdr)) + data); err != nil {
		tb.Fatal(err)
	}
	if scatter {
		rng := rand.New(rand.NewPCG(9, 10))
		for range 64 {
			b := make([]byte, 1+rng.IntN(3<<20))
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if _, err := f.WriteAt(b, int64(len(hdr))+rng.Int64N(data-int64(len(b)))); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return data
}

const rssLimitKiB = 200 * 1000 // "under 200 MB"

// warm reads a file once, untimed, so benchmarks measure hashing from the
// page cache (the reference anchors are warm-cache figures too); the first
// read of a hole would otherwise also pay for zero-filling the cache.
func warm(b *testing.B, p string) {
	f, err := os.Open(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		b.Fatal(err)
	}
}

// inspect --hash on a 256 MiB sparse file, one job on one core: the
// digests equal sha256 of the bytes, and the process stays small.
func TestInspectHashSparse(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sparse.safetensors")
	writeSparse(t, p, 4, 8192, 4096, true) // 4 × 64 MiB
	r := execFerry(t, []string{"GOMAXPROCS=1"}, "inspect", "--json", "--hash", "--jobs", "1", p)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var rep inspect.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Tensors) != 4 {
		t.Fatalf("%d rows", len(rep.Tensors))
	}
	checkRowHashes(t, dir, rep.Tensors)
	if r.maxRSSKiB <= 0 || r.maxRSSKiB >= rssLimitKiB {
		t.Errorf("peak RSS %d KiB, want under %d", r.maxRSSKiB, rssLimitKiB)
	}
	t.Logf("peak RSS %.1f MB hashing 256 MiB", float64(r.maxRSSKiB)*1024/1e6)
}

// BenchmarkInspectHash4GiB runs `ferry inspect --hash --jobs 1` with
// GOMAXPROCS=1 as a child process on a sparse 4 GiB safetensors file (four
// 1 GiB BF16 tensors) and reports its throughput (MB/s of tensor data) and
// peak RSS from wait4's rusage (peak-RSS-MB). It fails if RSS reaches
// 200 MB.
//
// The RSS is an upper bound: Go starts children with clone(CLONE_VM), and
// Linux carries the pre-exec high-water mark (the parent test process's
// RSS, ~25-30 MB) into the child's ru_maxrss — sha256sum shows the same
// floor in the anchor below.
func BenchmarkInspectHash4GiB(b *testing.B) {
	p := filepath.Join(b.TempDir(), "4gib.safetensors")
	data := writeSparse(b, p, 4, 32768, 16384, false)
	warm(b, p)
	b.SetBytes(data)
	var peak int64
	for b.Loop() {
		r := execFerry(b, []string{"GOMAXPROCS=1"}, "inspect", "--json", "--hash", "--jobs", "1", p)
		if r.code != 0 {
			b.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		peak = max(peak, r.maxRSSKiB)
	}
	b.ReportMetric(float64(peak)*1024/1e6, "peak-RSS-MB")
	if peak >= rssLimitKiB {
		b.Errorf("peak RSS %d KiB, want under %d", peak, rssLimitKiB)
	}
}

// Anchors for BenchmarkInspectHash4GiB, measured in the same run: the
// system's sha256sum over the same sparse file (a child process too), and
// Go's sha256 over a buffer already in memory (the ceiling: no reads).
func BenchmarkInspectHashAnchorSha256sum4GiB(b *testing.B) {
	bin, err := exec.LookPath("sha256sum")
	if err != nil {
		b.Skip("no sha256sum on this machine")
	}
	p := filepath.Join(b.TempDir(), "4gib.safetensors")
	writeSparse(b, p, 4, 32768, 16384, false)
	warm(b, p)
	st, _ := os.Stat(p)
	b.SetBytes(st.Size())
	var peak int64
	for b.Loop() {
		cmd := exec.Command(bin, p)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		peak = max(peak, sysmem.PeakRSS(cmd.ProcessState)>>10)
	}
	b.ReportMetric(float64(peak)*1024/1e6, "peak-RSS-MB")
}

// One op hashes 1 GiB (a 1 MiB buffer 1024 times), so `make bench`'s
// -benchtime 1x measures about a second of hashing, not one 1 MiB write.
func BenchmarkInspectHashAnchorSHA256Memory(b *testing.B) {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(1 << 30)
	h := sha256.New()
	for b.Loop() {
		for range 1024 {
			h.Write(buf)
		}
	}
}
