package merge

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/safetensors"
)

// TestShardDone: ShardDone is told of every shard once, as whole and
// durable under its name (the file there hashes to what it is told), by
// a fresh merge and by one that keeps shards an earlier run finished; the
// index and aux files are not shards; its error fails the merge.
func TestShardDone(t *testing.T) {
	dir := t.TempDir()
	base, ad := writeMultiShard(t, dir, 5, 64, 128)
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	run := func(out string, fail string) (map[string]FileDigest, *Result, error) {
		var mu sync.Mutex
		seen := map[string]FileDigest{}
		res, err := Execute(t.Context(), p, out, ExecOptions{Jobs: 2, Shards: 2, ShardDone: func(d FileDigest) error {
			// Whole under its name when told.
			got, n, herr := hashing.File(t.Context(), filepath.Join(out, d.Name), nil)
			mu.Lock()
			defer mu.Unlock()
			if herr != nil || got.Hex() != d.SHA256 || n != d.Size {
				t.Errorf("shard %s told before it is whole: %v, %s %d vs %s %d", d.Name, herr, got.Hex(), n, d.SHA256, d.Size)
			}
			if _, dup := seen[d.Name]; dup {
				t.Errorf("shard %s told twice", d.Name)
			}
			seen[d.Name] = d
			if d.Name == fail {
				return errors.New("handed on: refused")
			}
			return nil
		}})
		return seen, res, err
	}
	check := func(what string, seen map[string]FileDigest, res *Result) {
		t.Helper()
		var shards []string
		for _, f := range res.Files {
			if strings.HasSuffix(f.Name, ".safetensors") {
				shards = append(shards, f.Name)
				if seen[f.Name] != f {
					t.Errorf("%s: shard %s told %+v, result has %+v", what, f.Name, seen[f.Name], f)
				}
			}
		}
		if len(shards) != 5 || len(seen) != len(shards) {
			t.Errorf("%s: told of %d files, the merge wrote %d shards (%v)", what, len(seen), len(shards), slices.Sorted(maps.Keys(seen)))
		}
		if _, ok := seen[safetensors.IndexName]; ok {
			t.Errorf("%s: the index was told as a shard", what)
		}
	}

	out := filepath.Join(dir, "out")
	seen, res, err := run(out, "")
	if err != nil {
		t.Fatal(err)
	}
	check("fresh", seen, res)

	// A failing hand-on fails the merge, and the re-run keeps the shards
	// finished before and tells of them again.
	out2 := filepath.Join(dir, "out2")
	if _, _, err := run(out2, res.Files[len(res.Files)-2].Name); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("a ShardDone error did not fail the merge: %v", err)
	}
	if _, err := os.Stat(filepath.Join(out2, JournalName)); err != nil {
		t.Fatalf("the failed merge left no journal to resume from: %v", err)
	}
	seen, res2, err := run(out2, "")
	if err != nil {
		t.Fatal(err)
	}
	check("resumed", seen, res2)
	if len(res2.Resumed) == 0 {
		t.Errorf("the re-run kept no shard of the failed one")
	}
	if !slices.Equal(res.Files, res2.Files) {
		t.Errorf("resumed merge's files differ: %+v vs %+v", res2.Files, res.Files)
	}
}
