package pipeline_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"

	. "github.com/ferry-llm/ferry/pipeline"
)

// The mmproj option of the gguf and quantize stages on a vision-language
// checkpoint: the gguf stage (mmproj: auto) writes the text GGUF and
// mmproj-<model_name>-F16.gguf, the bytes `ferry gguf convert --mmproj`
// writes from a directory of that name; the quantize stage (from the
// checkpoint, same model_name, mmproj: auto) writes the same mmproj beside
// its quants (one blob in the store); a quantize stage from the gguf stage
// takes the text GGUF and leaves the mmproj; verify_mtp over all of them
// with require passes (the mmproj is not_applicable). On the text-only
// example mmproj: auto writes nothing more, and mmproj: true is refused
// when the pipeline is planned, naming the checkpoint.
func TestMMProjStages(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "vl")
	if _, err := (testmodel.Qwen35Options{ConditionalGeneration: true, Vision: &testmodel.Vision{}}).Write(base); err != nil {
		t.Fatal(err)
	}
	// What `ferry gguf convert --mmproj` writes from a directory named Jarvis.
	named := filepath.Join(dir, "names", "Jarvis")
	if _, err := (testmodel.Qwen35Options{ConditionalGeneration: true, Vision: &testmodel.Vision{}}).Write(named); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(named)
	if err != nil {
		t.Fatal(err)
	}
	p, err := convert.NewPlan(ck, convert.Options{MMProj: true})
	if err != nil {
		t.Fatal(err)
	}
	direct := filepath.Join(dir, "direct.gguf")
	if err := convert.Write(context.Background(), p, direct, convert.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	ck.Close()
	want, _, err := manifest.HashFile(direct)
	if err != nil {
		t.Fatal(err)
	}

	src := `name: vl
stages:
  - name: base
    import: { path: ` + base + ` }
  - name: f16
    gguf: { from: base, model_name: Jarvis, mmproj: auto }
  - name: quants
    quantize: { from: base, model_name: Jarvis, types: [Q8_0], mmproj: auto }
  - name: q4
    quantize: { from: f16, type: Q4_K_M }
  - name: checked
    verify_mtp: { from: [f16, quants, q4], require: true }
`
	spec := loadSpec(t, filepath.Join(dir, "p"), src)
	plan, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s := plan.Stages[1].Plan; !strings.Contains(s, "+ mmproj (vision tower, f16, 34 tensors") {
		t.Errorf("f16 plan %q", s)
	}
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string][]manifest.Output{}
	for _, s := range rep.Stages {
		outs[s.Stage] = s.Outputs
	}
	find := func(stage, name string) *manifest.Output {
		for i, o := range outs[stage] {
			if o.Path == name {
				return &outs[stage][i]
			}
		}
		t.Errorf("stage %s has no %s: %+v", stage, name, outs[stage])
		return nil
	}
	for _, stage := range []string{"f16", "quants"} {
		if o := find(stage, "mmproj-Jarvis-F16.gguf"); o != nil && o.Digest != want {
			t.Errorf("%s's mmproj %s, ferry gguf convert --mmproj's %s", stage, o.Digest.Short(), want.Short())
		}
	}
	find("f16", "Jarvis-283K-F16.gguf")
	find("quants", "Jarvis-283K-Q8_0.gguf")
	if o := outs["q4"]; len(o) != 1 || o[0].Path != "Jarvis-283K-Q4_K_M.gguf" {
		t.Errorf("q4 outputs %+v", o)
	}
	if len(outs["checked"]) != 1 {
		t.Errorf("checked outputs %+v", outs["checked"])
	}

	// The text-only example: auto adds nothing; true is refused at plan.
	for _, c := range []struct{ mode, want string }{{"auto", ""}, {"true", "has no vision tower"}} {
		src := `name: text
stages:
  - name: base
    import: { path: ` + tinyBase(t) + ` }
  - name: f16
    gguf: { from: base, mmproj: ` + c.mode + ` }
`
		spec := loadSpec(t, filepath.Join(dir, "text-"+c.mode), src)
		plan, err := Plan(spec, Options{})
		if c.want != "" {
			if err == nil && plan.Stages[1].Error == "" {
				t.Errorf("mmproj: true on a text-only checkpoint planned: %+v", plan.Stages[1])
			} else if msg := errText(err, plan); !strings.Contains(msg, c.want) || !strings.Contains(msg, "qwen35-tiny/base") {
				t.Errorf("mmproj: true: %q should say %q and name the checkpoint", msg, c.want)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan.Stages[1].Plan, "(no vision tower: no mmproj)") {
			t.Errorf("auto plan %q", plan.Stages[1].Plan)
		}
		rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if o := rep.Stages[1].Outputs; len(o) != 1 || strings.HasPrefix(o[0].Path, "mmproj-") {
			t.Errorf("auto on a text-only checkpoint: outputs %+v", o)
		}
	}
}

// errText is a failed plan's message: the error, or the stage's.
func errText(err error, rep *Report) string {
	if err != nil {
		return err.Error()
	}
	for _, s := range rep.Stages {
		if s.Error != "" {
			return s.Error
		}
	}
	return ""
}
