package mlxpack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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
				n := 0
				_, err := Quantize(ctx, p, out, QuantizeRunOptions{Jobs: tc.jobs, Digests: true, JournalEvery: time.Nanosecond,
					UnitDone: func(string, int64, int64) {
						if n++; n == tc.cancel {
							cancel()
						}
					}})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled run: %v", err)
				}
			}
			res, err := Quantize(context.Background(), p, out, QuantizeRunOptions{Jobs: tc.jobs, Digests: true})
			if err != nil {
				t.Fatal(err)
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
