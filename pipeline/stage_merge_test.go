package pipeline_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/merge"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// The merge stage's outputs are byte-identical to merge.Execute run
// directly on the same checkpoint and adapter (the bundled qwen35-tiny
// example, whose PEFT fidelity the merge package's golden tests check), and
// a second run skips it.
func TestMergeStageMatchesMerge(t *testing.T) {
	models, err := filepath.Abs("../testdata/models/qwen35-tiny")
	if err != nil {
		t.Fatal(err)
	}
	base, adapter := filepath.Join(models, "base"), filepath.Join(models, "adapter-dora")

	plan, err := merge.Inventory(base, adapter, merge.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := merge.Execute(context.Background(), plan, filepath.Join(t.TempDir(), "m"), merge.ExecOptions{Jobs: 2})
	plan.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, f := range direct.Files {
		want[filepath.ToSlash(f.Name)] = f.SHA256
	}

	dir := t.TempDir()
	spec := loadSpec(t, dir, `name: m
stages:
  - name: base
    import: { path: `+base+` }
  - name: adapter
    import: { path: `+adapter+` }
  - name: merged
    merge: { base: base, adapter: adapter }
    out: out/merged
`)
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	outs := rep.Stages[2].Outputs
	if len(outs) != len(want) {
		t.Fatalf("%d outputs, merge wrote %d files", len(outs), len(want))
	}
	for _, o := range outs {
		if want[o.Path] != o.Digest.Hex() {
			t.Errorf("%s: %s, merge wrote %s", o.Path, o.Digest.Short(), want[o.Path])
		}
	}
	rep, err = Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "second run", rep, map[string]string{"base": "skip", "adapter": "skip", "merged": "skip"})
}

// allow_nonfinite reaches the merge and enters the stage key only when set:
// the key parameters of a merge stage without it are what they were before
// the option existed.
func TestMergeStageAllowNonFiniteParam(t *testing.T) {
	for _, tc := range []struct{ yaml, params string }{
		{"merge: { base: base, adapter: adapter }", `{"base":"base","adapter":"adapter"}`},
		{"merge: { base: base, adapter: adapter, allow_nonfinite: false }", `{"base":"base","adapter":"adapter"}`},
		{"merge: { base: base, adapter: adapter, dtype: f16, allow_nonfinite: true }", `{"base":"base","adapter":"adapter","dtype":"f16","allow_nonfinite":true}`},
	} {
		s, err := Parse("m.yaml", "/p", []byte("name: m\nstages:\n  - name: base\n    import: { path: b }\n  - name: adapter\n    import: { path: a }\n  - name: merged\n    "+tc.yaml+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(s.Lookup("merged").Stage.Params())
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.params {
			t.Errorf("%s: key params %s, want %s", tc.yaml, got, tc.params)
		}
	}
}

// nop is a Progress that counts nothing.
type nop struct{}

func (nop) SetTotal(int64) {}
func (nop) Add(int64)      {}

// A run killed after its merge finished (the merge's journal is gone) but
// before the record leaves a work dir of complete files and no journal:
// the stage starts that merge afresh instead of refusing the directory,
// and its outputs are the merge's.
func TestMergeStageAfterFinishedMerge(t *testing.T) {
	models, err := filepath.Abs("../testdata/models/qwen35-tiny")
	if err != nil {
		t.Fatal(err)
	}
	base, adapter := filepath.Join(models, "base"), filepath.Join(models, "adapter-dora")
	store, err := manifest.Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	env := WithStore(&Env{Stage: "merged", Key: "0123456789abcdef", Progress: nop{}, Jobs: 2,
		Inputs: []Input{{Stage: "base", Dir: base}, {Stage: "adapter", Dir: adapter}}}, store)
	work, err := env.WorkDir()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := merge.Inventory(base, adapter, merge.PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := merge.Execute(t.Context(), plan, work, merge.ExecOptions{Jobs: 2})
	plan.Close()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Parse("m.yaml", "/p", []byte("name: m\nstages:\n  - name: base\n    import: { path: b }\n  - name: adapter\n    import: { path: a }\n  - name: merged\n    merge: { base: base, adapter: adapter }\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := spec.Lookup("merged").Stage.Run(t.Context(), env)
	if err != nil {
		t.Fatalf("stage over a finished merge's work dir: %v", err)
	}
	if len(res.Outputs) != len(direct.Files) {
		t.Fatalf("%d outputs, merge wrote %d files", len(res.Outputs), len(direct.Files))
	}
	for i, f := range direct.Files {
		if o := res.Outputs[i]; o.Path != f.Name || o.Digest.Hex() != f.SHA256 {
			t.Errorf("output %s %s, merge wrote %s %s", o.Path, o.Digest.Short(), f.Name, f.SHA256)
		}
	}
}
