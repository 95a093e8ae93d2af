package quantize

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
)

// RunOptions.Digests: the digest RunMulti gives each file, hashed while
// it was written, is the SHA-256 of the file it leaves, whatever the
// workers, block size, report, split, and after a resume (the tensors
// kept from the interrupted run are read back, not written).
func TestRunMultiDigests(t *testing.T) {
	for _, c := range []struct {
		name      string
		types     []string
		ro        RunOptions
		split     gguf.SplitOptions
		interrupt int // cancel the first run after this many tensors, then run again
	}{
		{name: "one worker", types: []string{"Q6_K", "Q4_K_M", "Q2_K"}, ro: RunOptions{Jobs: 1}},
		{name: "small blocks", types: []string{"Q6_K", "Q4_K_M"}, ro: RunOptions{Jobs: 4, ChunkElems: 1 << 12}},
		{name: "with errors", types: []string{"Q4_K_M", "Q8_0"}, ro: RunOptions{Jobs: 3, Errors: true}},
		{name: "split", types: []string{"Q4_K_M", "Q8_0"}, ro: RunOptions{Jobs: 3}, split: gguf.SplitOptions{MaxTensors: 20}},
		{name: "resumed", types: []string{"Q6_K", "Q4_K_M"}, ro: RunOptions{Jobs: 2, ChunkElems: 1 << 12}, interrupt: 30},
		{name: "resumed split", types: []string{"Q4_K_M"}, ro: RunOptions{Jobs: 2}, split: gguf.SplitOptions{MaxTensors: 20}, interrupt: 25},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := OpenSource(input("qwen35"), SourceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var outs []Output
			for _, name := range c.types {
				ft, err := ParseType(name)
				if err != nil {
					t.Fatal(err)
				}
				p, err := s.NewPlan(Options{FileType: ft, Split: c.split})
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, Output{Plan: p, Path: filepath.Join(dir, OutputName(s.Stem(), ft))})
			}
			ro := c.ro
			ro.Digests, ro.NoSync = true, true
			if c.interrupt > 0 {
				ctx, cancel := context.WithCancel(context.Background())
				var done atomic.Int64
				first := ro
				first.JournalEvery = 1
				first.TensorDone = func(int, string) {
					if done.Add(1) == int64(c.interrupt) {
						cancel()
					}
				}
				if _, err := RunMulti(ctx, s.File, outs, first); !errors.Is(err, context.Canceled) {
					t.Fatalf("interrupted run: %v, want it cancelled", err)
				}
			}
			rs, err := RunMulti(context.Background(), s.File, outs, ro)
			if err != nil {
				t.Fatal(err)
			}
			resumed := 0
			for k, r := range rs {
				resumed += r.Resumed
				if len(r.Digests) != len(r.Files) || len(r.Files) != len(outs[k].Plan.Layout.Files(outs[k].Path)) {
					t.Fatalf("output %d: %d digests of %d files", k, len(r.Digests), len(r.Files))
				}
				if c.split.MaxTensors > 0 && len(r.Files) < 2 {
					t.Fatalf("output %d: %d files, want a split", k, len(r.Files))
				}
				for i, f := range r.Files {
					b, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					if sum := sha256.Sum256(b); !bytes.Equal(sum[:], r.Digests[i]) {
						t.Errorf("%s: digest %x, the file's %x", filepath.Base(f), r.Digests[i], sum)
					}
				}
			}
			if c.interrupt > 0 && resumed == 0 {
				t.Error("nothing was resumed: the test does not test a resume")
			}
		})
	}
	// Not asked for: none.
	dir := t.TempDir()
	_, rs := quantizeMulti(t, input("qwen35"), SourceOptions{}, []string{"Q8_0"}, dir, RunOptions{Jobs: 2})
	if rs[0].Digests != nil {
		t.Errorf("digests %x without RunOptions.Digests", rs[0].Digests)
	}
}
