package pipeline_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

func tinyBase(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../testdata/models/qwen35-tiny/base")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The gguf stage's output is byte-identical to convert.Write on the same
// checkpoint (whose fidelity gguf/convert's golden tests check), also when
// the stage was cancelled halfway and resumed.
func TestGGUFStageMatchesConvert(t *testing.T) {
	base := tinyBase(t)
	ck, err := safetensors.OpenDir(base)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16})
	if err != nil {
		t.Fatal(err)
	}
	direct := filepath.Join(t.TempDir(), "direct.gguf")
	if err := convert.Write(context.Background(), plan, direct, convert.WriteOptions{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	ck.Close()
	want, _, err := manifest.HashFile(direct)
	if err != nil {
		t.Fatal(err)
	}

	src := `name: g
stages:
  - name: base
    import: { path: ` + base + ` }
  - name: f16
    gguf: { from: base, outtype: f16 }
`
	for _, cancelAt := range []int64{0, 2 << 20} {
		dir := t.TempDir()
		spec := loadSpec(t, dir, src)
		if cancelAt > 0 {
			ctx, cancel := context.WithCancel(context.Background())
			prog := &cancelAfter{n: cancelAt, cancel: cancel}
			_, err := Run(ctx, spec, Options{Stages: 1, Workers: 1, Progress: func(string) Progress { return prog }})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled run: %v", err)
			}
		}
		rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		outs := rep.Stages[1].Outputs
		if len(outs) != 1 || outs[0].Digest != want || filepath.Ext(outs[0].Path) != ".gguf" {
			t.Errorf("cancel at %d: outputs %+v, want one .gguf with %s", cancelAt, outs, want.Short())
		}
	}
}

// verify_mtp passes on artifacts that keep the MTP head and fails (no
// record, ErrVerifyFailed) on one that dropped it when require is set.
func TestVerifyMTPStage(t *testing.T) {
	dir := t.TempDir()
	spec := loadSpec(t, dir, `name: v
stages:
  - name: base
    import: { path: `+tinyBase(t)+` }
  - name: f16
    gguf: { from: base, outtype: f16 }
  - name: nomtp
    gguf: { from: base, outtype: f16, no_mtp: true }
  - name: good
    verify_mtp: { from: [base, f16], require: true }
  - name: bad
    verify_mtp: { from: [nomtp], require: true }
`)
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if !errors.Is(err, ErrVerifyFailed) {
		t.Fatalf("err %v, want ErrVerifyFailed", err)
	}
	wantActions(t, "run", rep, map[string]string{"good": "run", "bad": "failed"})
	s, _ := manifest.Load(spec.Store)
	if s.StageRecord("v", "good") == nil || s.StageRecord("v", "bad") != nil {
		t.Error("want a record for good and none for bad")
	}
}
