package merge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/tensor"
)

// TestDigests: the digests Digests computes without writing are those of
// the shards Execute writes (merged, copied, a vision tower's, several
// shards at once or one), and a reader of each partial file Execute
// opens (ShardOpened) reads, up to what it is told is flushed, the
// shard's bytes: the whole shard by the time it is done.
func TestDigests(t *testing.T) {
	multi := t.TempDir()
	mbase, mad := writeMultiShard(t, multi, 5, 64, 128)
	// Three shards, the middle one's layer not adapted: copied.
	part := t.TempDir()
	pbase, pad := filepath.Join(part, "base"), filepath.Join(part, "adapter")
	var groups [][]genTensor
	var ats []genTensor
	for l := range 3 {
		pre := fmt.Sprintf("model.layers.%d.", l)
		groups = append(groups, []genTensor{gen(uint64(10*l+1), pre+"self_attn.q_proj.weight", tensor.BF16, 0.2, 32, 64)})
		if l != 1 {
			k := prefix + pre + "self_attn.q_proj"
			ats = append(ats, gen(uint64(10*l+3), k+".lora_A.weight", tensor.F32, 0.5, 8, 64),
				gen(uint64(10*l+4), k+".lora_B.weight", tensor.F32, 0.1, 32, 8))
		}
	}
	writeBase(t, pbase, groups)
	writeAdapter(t, pad, map[string]any{"target_modules": []string{"q_proj"}, "r": 8, "lora_alpha": 16}, ats)
	cases := []struct {
		name, base, adapter string
		opt                 ExecOptions
	}{
		{"qwen35 dora", "../testdata/models/qwen35-tiny/base", "../testdata/models/qwen35-tiny/adapter-dora", ExecOptions{Jobs: 3}},
		{"qwen3 rslora", "testdata/reference/qwen3/base", "testdata/reference/qwen3/adapters/rslora", ExecOptions{Jobs: 2}},
		{"five shards, two at once", mbase, mad, ExecOptions{Jobs: 4, Shards: 2, BlockElems: 1 << 10}},
		{"five shards, one at a time", mbase, mad, ExecOptions{Jobs: 1, Shards: 1}},
		{"a shard copied", pbase, pad, ExecOptions{Jobs: 2, Shards: 3}},
		// Both at once on two cores: the merge's workers take them
		// first, the pass ahead what they leave.
		{"beside the merge, on its idle cores", mbase, mad, ExecOptions{Jobs: 4, Shards: 2, BlockElems: 1 << 10, Cores: cpushare.New(2).Share(5)}},
	}
	kinds := map[bool]bool{} // shards rewritten, copied
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Inventory(c.base, c.adapter, PlanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var mu sync.Mutex
			ahead := map[string]FileDigest{}
			aopt := c.opt
			aopt.Cores = c.opt.Cores.Idle()
			aheadErr := make(chan error, 1)
			go func() {
				aheadErr <- Digests(context.Background(), p, aopt, nil, func(d FileDigest) error {
					mu.Lock()
					defer mu.Unlock()
					ahead[d.Name] = d
					return nil
				})
			}()
			if c.opt.Cores == nil {
				// One after the other.
				if err := <-aheadErr; err != nil {
					t.Fatal(err)
				}
				aheadErr <- nil
			}
			out := filepath.Join(t.TempDir(), "merged")
			read := map[string]func() []byte{}
			opt := c.opt
			opt.ShardOpened = func(name, path string, flushed func() int64) {
				f, err := os.Open(path)
				if err != nil {
					t.Errorf("%s: opening the partial file: %v", name, err)
					return
				}
				t.Cleanup(func() { f.Close() })
				mu.Lock()
				read[name] = func() []byte {
					n := flushed()
					b := make([]byte, n)
					if _, err := f.ReadAt(b, 0); err != nil && err != io.EOF {
						t.Errorf("%s: reading the partial file: %v", name, err)
					}
					return b
				}
				mu.Unlock()
			}
			var checked int
			opt.ShardDone = func(d FileDigest) error {
				mu.Lock()
				r := read[d.Name]
				mu.Unlock()
				if r == nil {
					t.Errorf("%s done, never opened", d.Name)
					return nil
				}
				b := r()
				if sum := sha256.Sum256(b); int64(len(b)) != d.Size || hex.EncodeToString(sum[:]) != d.SHA256 {
					t.Errorf("%s: the partial file's %d flushed bytes are not the shard (%d bytes)", d.Name, len(b), d.Size)
				}
				mu.Lock()
				checked++
				mu.Unlock()
				return nil
			}
			res, err := Execute(context.Background(), p, out, opt)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-aheadErr; err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			shards := 0
			for _, f := range res.Files {
				if !strings.HasSuffix(f.Name, ".safetensors") {
					continue
				}
				shards++
				if ahead[f.Name] != f {
					t.Errorf("%s: Digests %+v, Execute wrote %+v", f.Name, ahead[f.Name], f)
				}
			}
			for _, sp := range p.Shards {
				kinds[sp.Rewrite] = true
			}
			if shards == 0 || len(ahead) != shards || checked != shards {
				t.Errorf("%d shards written, %d digests computed ahead, %d read as written", shards, len(ahead), checked)
			}
		})
	}
	if !kinds[true] || !kinds[false] {
		t.Errorf("the cases rewrite shards %v and copy shards %v, want both", kinds[true], kinds[false])
	}
}

// Digests passes over the shards skip names (those an earlier run
// finished) and works out the others.
func TestDigestsSkip(t *testing.T) {
	base, ad := writeMultiShard(t, t.TempDir(), 4, 32, 64)
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	skipped := map[string]bool{p.Shards[0].Name: true, p.Shards[2].Name: true}
	var mu sync.Mutex
	var got []string
	err = Digests(context.Background(), p, ExecOptions{Jobs: 2}, func(name string) bool { return skipped[name] }, func(d FileDigest) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d.Name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{p.Shards[1].Name, p.Shards[3].Name}; !slices.Equal(got, want) {
		t.Errorf("digests of %v, want %v", got, want)
	}
}

// A partial file whose checkpoint cannot be resumed (a hash state that
// does not decode) starts over: its Flushed count starts at 0 with it,
// not at the checkpoint's end, and counts what reaches the file.
func TestFlushedAfterFailedResume(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, "key")
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if err := os.WriteFile(partialPath(dir, "s.safetensors"), make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	j.ckpt["s.safetensors"] = journal.Entry{Unit: "s.safetensors", End: 2048, State: []byte("not a hash state")}
	o, err := j.openShard("s.safetensors", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer o.f.Close()
	if o.Written() != 0 || o.Flushed() != 0 {
		t.Fatalf("started over with %d bytes written, %d flushed; want 0 and 0", o.Written(), o.Flushed())
	}
	if _, err := o.Write(make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	if f := o.Flushed(); f < 2<<20 || f > 3<<20 {
		t.Errorf("3 MiB written through a 1 MiB buffer: %d flushed", f)
	}
}
