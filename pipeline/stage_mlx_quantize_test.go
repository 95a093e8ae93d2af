package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/mlxpack"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// mlx_quantize in a pipeline writes what `ferry mlx quantize` writes (the
// same files, by digest), and its view is that directory; with keep_mtp
// the verify_mtp stage after it passes with require: true. For the
// text-only Qwen3.5 and for the vision-language wrapper
// (Qwen3_5ForConditionalGeneration: nested text_config, model.visual.*
// dropped as mlx-lm drops it, the head at the top level).
func TestMLXQuantizeStage(t *testing.T) {
	for _, src := range []string{"../testdata/models/qwen35-tiny/base", "../testdata/models/qwen35vl-tiny/base"} {
		t.Run(filepath.Base(filepath.Dir(src)), func(t *testing.T) { mlxQuantizeStage(t, src) })
	}
}

func mlxQuantizeStage(t *testing.T, src string) {
	dir := t.TempDir()
	base, _ := filepath.Abs(src)
	opts := mlxpack.QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}
	plan, err := mlxpack.PlanQuantize(base, opts)
	if err != nil {
		t.Fatal(err)
	}
	direct := filepath.Join(dir, "direct")
	if _, err := mlxpack.Quantize(context.Background(), plan, direct, mlxpack.QuantizeRunOptions{}); err != nil {
		t.Fatal(err)
	}
	plan.Close()
	spec := loadSpec(t, dir, `name: x
stages:
  - name: base
    import: { path: `+base+` }
  - name: mlx4
    mlx_quantize: { from: base, bits: 4, group_size: 64, keep_mtp: true }
    out: out/mlx4
  - name: checked
    verify_mtp: { from: [mlx4], require: true }
`)
	rep, err := Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	outs := rep.Stages[1].Outputs
	ents, _ := os.ReadDir(direct)
	if len(outs) != len(ents) {
		t.Fatalf("%d outputs, the command made %d files", len(outs), len(ents))
	}
	for _, o := range outs {
		d, _, err := manifest.HashFile(filepath.Join(direct, o.Path))
		if err != nil || d != o.Digest {
			t.Errorf("%s: %s, the command's %s (%v)", o.Path, o.Digest.Short(), d.Short(), err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "out/mlx4", o.Path))
		if err != nil || manifest.DigestOf(b) != o.Digest {
			t.Errorf("view %s: %v", o.Path, err)
		}
	}
}
