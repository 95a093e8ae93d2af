package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/mlxpack"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// mlx_repack in a pipeline gives what mlxpack.Repack gives run directly:
// the same new files (by digest), and for every linked file the source's
// own blob (nothing copied).
func TestMLXRepackStage(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		dir := t.TempDir()
		ct := filepath.Join(dir, "ct")
		model := testmodel.CompressedDeepSeekV3(7) // mlx-lm renames its packed tensors: a pure link farm
		if rewrite {
			model = testmodel.CompressedQwen3(7) // needs rewritten shards
		}
		if err := model.Write(ct); err != nil {
			t.Fatal(err)
		}
		plan, err := mlxpack.PlanRepack(ct, mlxpack.Options{Rewrite: rewrite, Relative: true})
		if err != nil {
			t.Fatal(err)
		}
		direct := filepath.Join(dir, "direct")
		if _, err := mlxpack.Repack(context.Background(), plan, direct); err != nil {
			t.Fatal(err)
		}
		plan.Close()
		want := map[string]manifest.Digest{}
		filepath.Walk(direct, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				rel, _ := filepath.Rel(direct, p)
				d, _, herr := manifest.HashFile(p) // follows links to the source
				if herr != nil {
					t.Fatal(herr)
				}
				want[filepath.ToSlash(rel)] = d
			}
			return nil
		})

		spec := loadSpec(t, dir, `name: x
stages:
  - name: ct
    import: { path: ct }
  - name: mlx
    mlx_repack: { from: ct, rewrite: `+map[bool]string{false: "false", true: "true"}[rewrite]+` }
    out: out/mlx
`)
		rep, err := Run(context.Background(), spec, Options{})
		if err != nil {
			t.Fatal(err)
		}
		outs := rep.Stages[1].Outputs
		if len(outs) != len(want) {
			t.Fatalf("rewrite=%v: %d outputs, direct repack made %d files", rewrite, len(outs), len(want))
		}
		srcBlobs := map[manifest.Digest]bool{}
		for _, o := range rep.Stages[0].Outputs {
			srcBlobs[o.Digest] = true
		}
		links := 0
		for _, o := range outs {
			if want[o.Path] != o.Digest {
				t.Errorf("rewrite=%v: %s: %s, direct %s", rewrite, o.Path, o.Digest.Short(), want[o.Path].Short())
			}
			if srcBlobs[o.Digest] {
				links++
			}
			b, err := os.ReadFile(filepath.Join(dir, "out/mlx", o.Path))
			if err != nil || manifest.DigestOf(b) != o.Digest {
				t.Errorf("view %s: %v", o.Path, err)
			}
		}
		if links == 0 {
			t.Errorf("rewrite=%v: no output shares the source's blobs", rewrite)
		}
	}
}
