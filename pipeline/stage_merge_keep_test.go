package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// TestMergeStageKeptShardsAreImportBlobs: with an adapter that touches one
// shard of the three, the merge stage's other two shards have the digests
// of the imported base shards, so in the content-addressed store they are
// the base's blobs, not new ones.
func TestMergeStageKeptShardsAreImportBlobs(t *testing.T) {
	ref, err := filepath.Abs("../merge/testdata/reference/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(ref, "base")
	dir := t.TempDir()
	adapter := filepath.Join(dir, "adapter")
	if err := os.MkdirAll(adapter, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(ref, "adapters/rslora/adapter_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(adapter, "adapter_config.json"), string(cfg))
	// Only layer 1's down_proj, which lives in model-00003-of-00003.
	src, err := safetensors.Open(filepath.Join(ref, "adapters/rslora/adapter_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var specs []safetensors.TensorSpec
	var keep []safetensors.TensorInfo
	for _, ti := range src.Tensors {
		if strings.Contains(ti.Name, "layers.1.mlp.down_proj.") {
			specs = append(specs, safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
			keep = append(keep, ti)
		}
	}
	if len(keep) != 2 {
		t.Fatalf("reference rsLoRA adapter has %d layer-1 down_proj factors, want 2", len(keep))
	}
	w, err := safetensors.Create(filepath.Join(adapter, "adapter_model.safetensors"), src.Metadata, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range keep {
		if err := w.WriteTensor(ti.Name, src.Section(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	spec := loadSpec(t, dir, `name: m
stages:
  - name: base
    import: { path: `+base+` }
  - name: adapter
    import: { path: `+adapter+` }
  - name: merged
    merge: { base: base, adapter: adapter }
`)
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]string{}
	for _, o := range rep.Stages[0].Outputs {
		imported[o.Path] = o.Digest.Hex()
	}
	kept, changed := 0, 0
	for _, o := range rep.Stages[2].Outputs {
		if !strings.HasSuffix(o.Path, ".safetensors") {
			continue
		}
		want, ok := imported[o.Path]
		if !ok {
			t.Errorf("merge output %s is not a base shard name", o.Path)
			continue
		}
		switch {
		case o.Path == "model-00003-of-00003.safetensors":
			changed++
			if o.Digest.Hex() == want {
				t.Errorf("%s holds the adapted tensor but equals the base shard", o.Path)
			}
		case o.Digest.Hex() != want:
			t.Errorf("kept shard %s: blob %s, the imported base shard is %s", o.Path, o.Digest.Short(), want[:12])
		default:
			kept++
		}
	}
	if kept != 2 || changed != 1 {
		t.Errorf("%d kept shards and %d rewritten, want 2 and 1", kept, changed)
	}
}
