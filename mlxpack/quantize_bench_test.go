package mlxpack

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// wideCheckpoint is a Qwen3.5-27B-width checkpoint
// (benchtest.Checkpoint27B): testmodel.Large27B, 4 layers (3
// linear-attention + 1 full) + 1 MTP layer at the real widths, BF16, 2 GB
// shards. The vocabulary is 32768 by default (4.56 GB);
// FERRY_BENCH_VOCAB=248320 gives the anchors.md slice itself (8.99 GB,
// where mlx_lm.convert -q took 29.3 s, 7.9 GiB, 12.3× cp).
// FERRY_BENCH_LAYERS sets the layer count, FERRY_BENCH_DIR keeps the
// checkpoint between runs.
func wideCheckpoint(b *testing.B) benchtest.Checkpoint {
	return benchtest.Checkpoint27B(b, benchtest.EnvInt(b, "FERRY_BENCH_LAYERS", 4), benchtest.EnvInt(b, "FERRY_BENCH_VOCAB", 32768), false)
}

func TestMain(m *testing.M) { benchtest.Main(m) }

// BenchmarkQuantizeQwen35MLX4 converts the 27B-width checkpoint to 4-bit
// MLX (group 64, the MTP head dropped: mlx_lm.convert -q) in a child
// process on every core, as `ferry mlx quantize` runs it (journal,
// rename), and in the same run copies the shards with cp (warm page
// cache, as anchors.md measured both). Reported: MB/s of input, peak RSS
// of the converting process, and the ratio of its wall time to cp's — the
// figure to hold against mlx_lm.convert's 12.3× cp (anchors.md).
func BenchmarkQuantizeQwen35MLX4(b *testing.B) {
	ck := wideCheckpoint(b)
	dir, shards, in := ck.Dir, ck.Shards, ck.Bytes
	work := b.TempDir()
	benchtest.Run(b, nil, "cat", shards...) // warm the page cache
	b.SetBytes(in)
	b.ResetTimer()
	var conv, cp time.Duration
	var rss int64
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(work, "cp")
		os.MkdirAll(dst, 0o755)
		cp += benchtest.Run(b, nil, "cp", append(append([]string{}, shards...), dst)...).Wall
		os.RemoveAll(dst)
		out := filepath.Join(work, "mlx4")
		m := benchtest.Run(b, []string{"FERRY_MLXQ_CHILD=" + dir + ":" + out + ":4:0:1s"}, os.Args[0], "-test.run=^$")
		conv += m.Wall
		rss = max(rss, m.PeakRSS)
		os.RemoveAll(out)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(in)/1e6/(conv.Seconds()/n), "MB/s")
	b.ReportMetric(float64(rss)/(1<<20), "peakRSS-MiB")
	b.ReportMetric(conv.Seconds()/cp.Seconds(), "x-cp")
	b.ReportMetric(conv.Seconds()/n, "convert-s")
	b.ReportMetric(cp.Seconds()/n, "cp-s")
	b.Logf("input %d bytes; mlx quantize %.2fs, cp %.2fs (%.2f× cp; mlx_lm.convert -q: 12.3× cp in anchors.md), peak RSS %.0f MiB",
		in, conv.Seconds()/n, cp.Seconds()/n, conv.Seconds()/cp.Seconds(), float64(rss)/(1<<20))
}

// BenchmarkQuantizeInProcess is the 4-bit conversion of a ~10 MB
// Qwen3.5-shaped checkpoint in process (one worker), for profiles and
// quick regressions.
func BenchmarkQuantizeInProcess(b *testing.B) {
	src := filepath.Join(b.TempDir(), "src")
	o := testmodel.Qwen35Options{Common: testmodel.Common{VocabSize: 1024, HiddenSize: 512, IntermediateSize: 1024, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 128, MaxShardSize: 8 << 20}, Hybrid: testmodel.Hybrid{LinearKeyHeadDim: 64, LinearValueHeadDim: 64}}
	if _, err := o.Write(src); err != nil {
		b.Fatal(err)
	}
	p, err := PlanQuantize(src, QuantizeOptions{Bits: 4, GroupSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	b.SetBytes(p.SourceBytes())
	work := b.TempDir()
	for i := 0; i < b.N; i++ {
		out := filepath.Join(work, strconv.Itoa(i))
		if _, err := Quantize(context.Background(), p, out, QuantizeRunOptions{Jobs: 1}); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(out)
	}
}

// BenchmarkQuantizeDigests is what the mlx_quantize stage pays for the
// shards' digests: converting the 27B-width checkpoint to 4-bit MLX with
// the shards hashed while they are written (QuantizeRunOptions.Digests:
// a reader per shard follows the workers) against converting and then
// hashing each shard, read back whole (as the stage adopted them before).
// Reported per conversion: wall and CPU seconds (this process's, user
// and system) of each.
func BenchmarkQuantizeDigests(b *testing.B) {
	ck := wideCheckpoint(b)
	p, err := PlanQuantize(ck.Dir, QuantizeOptions{Bits: 4, GroupSize: 64})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for _, follow := range []bool{true, false} {
		name := "after"
		if follow {
			name = "while-written"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(p.SourceBytes())
			work := b.TempDir()
			var wall, cpu time.Duration
			for i := range b.N {
				out := filepath.Join(work, strconv.Itoa(i))
				c0, t0 := benchtest.ProcessCPU(b), time.Now()
				res, err := Quantize(context.Background(), p, out, QuantizeRunOptions{Digests: follow})
				if err != nil {
					b.Fatal(err)
				}
				for _, name := range p.shardNames() {
					if follow {
						if _, ok := res.Digests[name]; !ok {
							b.Fatalf("%s: no digest", name)
						}
						continue
					}
					if _, _, err := hashing.File(context.Background(), filepath.Join(out, name), nil); err != nil {
						b.Fatal(err)
					}
				}
				wall += time.Since(t0)
				cpu += benchtest.ProcessCPU(b) - c0
				os.RemoveAll(out)
			}
			b.ReportMetric(wall.Seconds()/float64(b.N), "s")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s")
		})
	}
}

func (p *QuantizePlan) shardNames() []string {
	var names []string
	for _, s := range p.shards {
		names = append(names, s.name)
	}
	return names
}
