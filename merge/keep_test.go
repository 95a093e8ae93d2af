package merge

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// TestKeptShardIsIdenticalFile: a base shard holding no adapted tensor is
// planned as "keep" and comes out as a byte-identical file under the same
// name; the rewritten shard keeps the base's name, its tensor set and
// tensor order. (Every golden case rewrites all shards, so this is the test
// that exercises the keep path.)
func TestKeptShardIsIdenticalFile(t *testing.T) {
	var fc featureCase
	for _, c := range featureCases() {
		if c.name == "layers-to-transform" { // only layer 1 (shard 2) is adapted
			fc = c
		}
	}
	if fc.name == "" {
		t.Fatal("feature case layers-to-transform is gone")
	}
	dir := t.TempDir()
	baseDir, adapterDir, _, _, _ := buildCase(t, dir, fc)
	out := filepath.Join(dir, "out")
	p, res := runMerge(t, baseDir, adapterDir, out, PlanOptions{}, 2)

	kept, rewritten := 0, 0
	for _, sp := range p.Shards {
		a, err := os.ReadFile(filepath.Join(baseDir, sp.Name))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(out, sp.Name))
		if err != nil {
			t.Fatalf("output lacks the base's shard %s: %v", sp.Name, err)
		}
		if !sp.Rewrite {
			kept++
			if !bytes.Equal(a, b) {
				t.Errorf("kept shard %s is not a byte copy of the base's", sp.Name)
			}
			continue
		}
		rewritten++
		if bytes.Equal(a, b) {
			t.Errorf("rewritten shard %s equals the base's: nothing was merged", sp.Name)
		}
		bf, err := safetensors.Open(filepath.Join(baseDir, sp.Name))
		if err != nil {
			t.Fatal(err)
		}
		of, err := safetensors.Open(filepath.Join(out, sp.Name))
		if err != nil {
			bf.Close()
			t.Fatal(err)
		}
		if len(bf.Tensors) != len(of.Tensors) {
			t.Errorf("%s: %d tensors, base has %d", sp.Name, len(of.Tensors), len(bf.Tensors))
		} else {
			for i := range bf.Tensors {
				if bf.Tensors[i].Name != of.Tensors[i].Name || bf.Tensors[i].Begin != of.Tensors[i].Begin {
					t.Errorf("%s: tensor %d is %q at %d, base has %q at %d", sp.Name, i, of.Tensors[i].Name, of.Tensors[i].Begin, bf.Tensors[i].Name, bf.Tensors[i].Begin)
				}
			}
		}
		bf.Close()
		of.Close()
	}
	if kept != 1 || rewritten != 1 {
		t.Fatalf("plan keeps %d and rewrites %d shards, want 1 and 1", kept, rewritten)
	}
	// The written files are exactly the base's shard names plus aux files
	// and the index.
	names := map[string]bool{}
	for _, f := range res.Files {
		names[f.Name] = true
	}
	for _, sp := range p.Shards {
		if !names[sp.Name] {
			t.Errorf("result lacks shard %s", sp.Name)
		}
	}
	if !names[safetensors.IndexName] {
		t.Errorf("result lacks %s", safetensors.IndexName)
	}
}
