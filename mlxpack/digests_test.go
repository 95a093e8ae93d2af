package mlxpack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
)

// TestQuantizeDigests: with Digests, every shard's digest and size are
// those of the file left in the output, whatever the worker count, with
// shards split, unquantized, an MTP head in side files, a vision tower,
// and a run resumed after a cancel (its journaled units hashed from the
// file, the others as they are written). The small files have none.
func TestQuantizeDigests(t *testing.T) {
	cases := []struct {
		name   string
		src    string
		opts   QuantizeOptions
		jobs   int
		cancel int // cancel the first run after this many units, then resume
	}{
		{"one job", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64}, 1, 0},
		{"split shards", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 32, ShardSize: 400_000}, 8, 0},
		{"unquantized", qwen35Base, QuantizeOptions{}, 3, 0},
		{"mtp side file", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}, 4, 0},
		{"vision tower", qwen35VLBase, QuantizeOptions{Bits: 4, GroupSize: 64}, 4, 0},
		{"resumed", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 32, ShardSize: 400_000}, 3, 25},
		{"resumed one job", qwen35Base, QuantizeOptions{Bits: 8, GroupSize: 64}, 1, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "mlx")
			p, err := PlanQuantize(tc.src, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if tc.cancel > 0 {
				ctx, cancel := context.WithCancel(context.Background())
				var n atomic.Int32
				_, err := Quantize(ctx, p, out, QuantizeRunOptions{Jobs: tc.jobs, Digests: true, JournalEvery: time.Nanosecond,
					UnitDone: func(string, int64, int64) {
						if int(n.Add(1)) == tc.cancel {
							cancel()
						}
					}})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled run: %v", err)
				}
			}
			var mu sync.Mutex
			told := map[string]FileSum{}
			res, err := Quantize(context.Background(), p, out, QuantizeRunOptions{Jobs: tc.jobs, Digests: true,
				ShardDone: func(path, name string, sum FileSum) error {
					// Whole when told: the file hashes to its digest.
					b, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					if got := sha256.Sum256(b); !bytes.Equal(got[:], sum.SHA256) || int64(len(b)) != sum.Size {
						return fmt.Errorf("%s told with %x (%d bytes), the file holds %x (%d bytes)", name, sum.SHA256, sum.Size, got, len(b))
					}
					mu.Lock()
					defer mu.Unlock()
					if _, ok := told[name]; ok {
						return fmt.Errorf("%s told twice", name)
					}
					told[name] = sum
					return nil
				}})
			if err != nil {
				t.Fatal(err)
			}
			// Every shard told once, kept ones too, with its digest.
			if len(told) != len(res.Digests) {
				t.Errorf("%d shards told, want %d", len(told), len(res.Digests))
			}
			for name, sum := range res.Digests {
				if got, ok := told[name]; !ok || !bytes.Equal(got.SHA256, sum.SHA256) || got.Size != sum.Size {
					t.Errorf("%s: told %v (%x), want its digest %x", name, ok, got.SHA256, sum.SHA256)
				}
			}
			if tc.cancel > 0 && res.ResumedUnits == 0 {
				t.Fatal("the second run resumed nothing")
			}
			var shards, got []string
			for _, name := range res.Files {
				if strings.HasSuffix(name, ".safetensors") {
					shards = append(shards, name)
				}
			}
			for name, sum := range res.Digests {
				got = append(got, name)
				b := mustRead(t, filepath.Join(out, name))
				if want := sha256.Sum256(b); !bytes.Equal(sum.SHA256, want[:]) {
					t.Errorf("%s: digest %x, the file's SHA-256 is %x", name, sum.SHA256, want)
				}
				if sum.Size != int64(len(b)) {
					t.Errorf("%s: size %d, the file has %d bytes", name, sum.Size, len(b))
				}
			}
			slices.Sort(shards)
			slices.Sort(got)
			if len(shards) == 0 || !slices.Equal(got, shards) {
				t.Errorf("digests of %q, want the shards %q", got, shards)
			}
		})
	}
}

// TestQuantizeNoDigests: without Digests nothing is hashed.
func TestQuantizeNoDigests(t *testing.T) {
	res := convertTo(t, qwen35Base, filepath.Join(t.TempDir(), "mlx"), QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 2})
	if res.Digests != nil {
		t.Errorf("digests %v without Digests", res.Digests)
	}
}

// TestQuantizeShardDoneEarly: a shard is told while the conversion goes
// on (the one worker, held before its last unit, waits for a shard to be
// told), durable and its units journaled: the partial directory as it is
// then (what a kill -9 leaves; copied aside), resumed, does not write
// that shard again (its inode and modification time stay; it is made
// read-only in between, as a store adopting it does) and ends with the
// bytes of an uninterrupted run.
func TestQuantizeShardDoneEarly(t *testing.T) {
	opts := QuantizeOptions{Bits: 4, GroupSize: 32, ShardSize: 400_000}
	p, err := PlanQuantize(qwen35Base, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// With one worker the units run in plan order: held after the
	// penultimate one is written, before it is counted, every shard the
	// last two do not write is whole and can be told.
	n := len(p.units)
	if n < 3 {
		t.Fatalf("%d units, want several", n)
	}
	late := map[int]bool{}
	for _, k := range []int{n - 2, n - 1} {
		for _, o := range p.Tensors[p.units[k].t].outs {
			late[o.shard] = true
		}
	}
	if len(late) >= len(p.shards) {
		t.Fatalf("the last two units write all %d shards", len(p.shards))
	}
	held := p.units[n-2]
	heldTensor := p.Tensors[held.t].Name

	out := filepath.Join(t.TempDir(), "mlx")
	killed := filepath.Join(t.TempDir(), "mlx") // the copy
	toldFirst := make(chan struct{})
	stop := errors.New("stopped after the first shard told")
	var first string
	var before os.FileInfo
	_, err = Quantize(context.Background(), p, out, QuantizeRunOptions{Jobs: 1, Digests: true, JournalEvery: time.Hour,
		UnitDone: func(tensor string, r0, r1 int64) {
			if tensor == heldTensor && r0 == held.r0 {
				select {
				case <-toldFirst:
				case <-time.After(20 * time.Second):
					t.Errorf("no shard told before the last unit")
				}
			}
		},
		ShardDone: func(path, name string, sum FileSum) error {
			if first != "" {
				t.Errorf("%s told after %s failed the run", name, first)
				return stop
			}
			first = name
			if err := os.CopyFS(PartialDir(killed), os.DirFS(filepath.Dir(path))); err != nil {
				return err
			}
			cp := filepath.Join(PartialDir(killed), name)
			if err := os.Chmod(cp, 0o444); err != nil {
				return err
			}
			var err error
			if before, err = os.Stat(cp); err != nil {
				return err
			}
			close(toldFirst)
			return stop
		}})
	if !errors.Is(err, stop) {
		t.Fatalf("run stopped by ShardDone: %v", err)
	}
	res, err := Quantize(context.Background(), p, killed, QuantizeRunOptions{Jobs: 2, Digests: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.ResumedUnits == 0 {
		t.Error("the resumed run kept no unit")
	}
	after, err := os.Stat(filepath.Join(killed, first))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("%s, told, written again by the resumed run: modified %v, was %v", first, after.ModTime(), before.ModTime())
	}
	want := filepath.Join(t.TempDir(), "mlx")
	convertTo(t, qwen35Base, want, opts, QuantizeRunOptions{Jobs: 2})
	for _, name := range res.Files {
		if !bytes.Equal(mustRead(t, filepath.Join(killed, name)), mustRead(t, filepath.Join(want, name))) {
			t.Errorf("%s differs from an uninterrupted run's", name)
		}
	}
}

// A worker that tells a shard (fsyncs, the caller's hand-over) gives its
// core back meanwhile: the one core of the gate is free in ShardDone.
func TestQuantizeShardDoneFreesCore(t *testing.T) {
	p, err := PlanQuantize(qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 32, ShardSize: 400_000})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The last unit of each shard pauses after its bytes are written:
	// the shard's hash is done by then, and the worker, counting the
	// unit, tells the shard itself.
	type at struct {
		tensor string
		r0     int64
	}
	last := map[at]bool{}
	for i := range p.shards {
		k := -1
		for u := range p.units {
			for _, o := range p.Tensors[p.units[u].t].outs {
				if o.shard == i {
					k = u
				}
			}
		}
		last[at{p.Tensors[p.units[k].t].Name, p.units[k].r0}] = true
	}
	g := cpushare.New(1)
	told := 0
	_, err = Quantize(context.Background(), p, filepath.Join(t.TempDir(), "mlx"), QuantizeRunOptions{Jobs: 1, Digests: true, Cores: g.Share(1),
		UnitDone: func(tensor string, r0, r1 int64) {
			if last[at{tensor, r0}] {
				time.Sleep(100 * time.Millisecond)
			}
		},
		ShardDone: func(path, name string, sum FileSum) error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := g.Acquire(ctx, 5); err != nil {
				return fmt.Errorf("%s told with the core held: %w", name, err)
			}
			g.Release()
			told++
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if told != len(p.shards) {
		t.Errorf("%d of %d shards told", told, len(p.shards))
	}
}
