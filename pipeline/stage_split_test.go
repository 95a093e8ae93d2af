package pipeline_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// The gguf and quantize stages with split_max_size / split_max_tensors
// record every part as an output, the parts llama-gguf-split makes
// (gguf/testdata/split); quantize and verify_mtp read the split through
// its first part; plan says the parts, status lists them, and a second
// run skips every stage.
func TestSplitStages(t *testing.T) {
	base, err := filepath.Abs("../testdata/models/qwen35vl-tiny/base")
	if err != nil {
		t.Fatal(err)
	}
	golden := "../gguf/testdata/split"
	sums, err := digest.ReadSums(filepath.Join(golden, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	// The import is named base: the converter names the model after the
	// directory, base, as the reference conversion did.
	src := `name: s
stages:
  - name: base
    import: { path: ` + base + ` }
  - name: f16
    gguf: { from: base, outtype: f16, split_max_size: 2M }
  - name: q4
    quantize: { from: f16, type: Q4_K_M, split_max_tensors: 20 }
  - name: checked
    verify_mtp: { from: [f16, q4], require: true }
`
	dir := t.TempDir()
	spec := loadSpec(t, dir, src)
	plan, err := Plan(spec, Options{Stages: 1, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p := plan.Stages[1].Plan; !strings.Contains(p, "in 3 parts") {
		t.Errorf("gguf stage plan %q does not say its parts", p)
	}
	rep, err := Run(t.Context(), spec, Options{Stages: 1, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	check := func(outs []manifest.Output, golden []string) {
		t.Helper()
		if len(outs) != len(golden) {
			t.Fatalf("outputs %+v, want %d parts", outs, len(golden))
		}
		for k, o := range outs {
			if want := sums[golden[k]]; o.Digest.String() != want.String() {
				t.Errorf("output %s: %s, llama-gguf-split's %s: %s", o.Path, o.Digest, golden[k], want)
			}
			if suffix := golden[k][strings.LastIndex(golden[k], "-0000"):]; !strings.HasSuffix(o.Path, suffix) {
				t.Errorf("output %s is not named as part %s", o.Path, golden[k])
			}
		}
	}
	t.Logf("gguf stage: %v; quantize stage: %v", rep.Stages[1].Outputs, rep.Stages[2].Outputs)
	check(rep.Stages[1].Outputs, []string{"base-F16-size2M-00001-of-00003.gguf", "base-F16-size2M-00002-of-00003.gguf", "base-F16-size2M-00003-of-00003.gguf"})
	check(rep.Stages[2].Outputs, []string{"base-Q4_K_M-t20-00001-of-00004.gguf", "base-Q4_K_M-t20-00002-of-00004.gguf", "base-Q4_K_M-t20-00003-of-00004.gguf", "base-Q4_K_M-t20-00004-of-00004.gguf"})
	if !strings.Contains(rep.Stages[2].Outputs[0].Path, "Q4_K_M") {
		t.Errorf("quantize outputs %+v: not named after the split's prefix and the type", rep.Stages[2].Outputs)
	}
	report, err := os.ReadFile(filepath.Join(spec.ViewDir(spec.Stages[3]), "mtp-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(report), `"verdict": "ok"`); n != 2 {
		t.Errorf("mtp-report.json: %d ok verdicts, want 2 (one per split):\n%s", n, report)
	}
	st, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Stages[2]; s.State != StateComplete || len(s.Outputs) != 4 {
		t.Errorf("status of q4: %s, %d outputs", s.State, len(s.Outputs))
	}
	rep, err = Run(t.Context(), spec, Options{Stages: 1, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if s.Action != ActionSkip {
			t.Errorf("second run: %s %s (%s)", s.Stage, s.Action, s.Reason)
		}
	}
}
