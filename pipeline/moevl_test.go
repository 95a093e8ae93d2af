package pipeline_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/testmodel"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A Qwen3.5-MoE vision-language model of our own making (the wrapper
// layout: text_config, model.language_model.*, model.visual.*, mtp.*, a
// DoRA adapter on the language model) goes through merge, MLX 4-bit with
// its MTP head kept, the text GGUF in parts, the mmproj beside it, split
// K-quants with the mmproj beside them, and the MTP gate, in one pipeline
// run; a second run skips every stage.
func TestMoEVisionLanguagePipeline(t *testing.T) {
	dir := t.TempDir()
	set, err := testmodel.Qwen35MoEVL(filepath.Join(dir, "model"), testmodel.Qwen35MoEVLDevice)
	if err != nil {
		t.Fatal(err)
	}
	src := `name: moevl
stages:
  - name: base
    import: { path: ` + filepath.Join(set.Dir, "base") + ` }
  - name: adapter
    import: { path: ` + set.AdapterDir + ` }
  - name: merged
    merge: { base: base, adapter: adapter }
  - name: mlx4
    mlx_quantize: { from: merged, bits: "4", group_size: "64", keep_mtp: true }
  - name: f16
    gguf: { from: merged, outtype: f16, model_name: MoEVL, mmproj: auto, split_max_tensors: 40 }
  - name: quants
    quantize: { from: merged, model_name: MoEVL, types: [Q4_K_M, Q6_K], split_max_tensors: 40, mmproj: auto }
  - name: checked
    verify_mtp: { from: [merged, mlx4, f16, quants], require: true }
`
	spec := loadSpec(t, dir, src)
	rep, err := Run(t.Context(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	outs := func(stage int) []string {
		var p []string
		for _, o := range rep.Stages[stage].Outputs {
			p = append(p, filepath.Base(o.Path))
		}
		return p
	}
	for i, st := range rep.Stages {
		t.Logf("%s: %s %v", st.Stage, st.Action, outs(i))
	}
	// f16: the text GGUF in parts and the mmproj.
	var parts, mmproj []string
	for _, o := range rep.Stages[4].Outputs {
		switch {
		case strings.HasPrefix(filepath.Base(o.Path), "mmproj-"):
			mmproj = append(mmproj, o.Path)
		case strings.Contains(o.Path, "-of-"):
			parts = append(parts, o.Path)
		}
	}
	if len(parts) < 2 || len(mmproj) != 1 {
		t.Fatalf("f16 outputs %v: want the text GGUF in parts and one mmproj", outs(4))
	}
	mf, err := gguf.Open(filepath.Join(spec.ViewDir(spec.Stages[4]), filepath.Base(mmproj[0])))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mf.MMProj(); !ok {
		t.Errorf("%s is not an mmproj", mmproj[0])
	}
	mf.Close()
	// The split text GGUF read through its first part: the whole model,
	// the MTP block included, no vision tensor.
	var first string
	for _, p := range parts {
		if strings.Contains(p, "-00001-of-") {
			first = p
		}
	}
	f, err := gguf.Open(filepath.Join(spec.ViewDir(spec.Stages[4]), filepath.Base(first)))
	if err != nil {
		t.Fatal(err)
	}
	nextn, vision := 0, 0
	for _, ti := range f.Tensors {
		if strings.Contains(ti.Name, "nextn") {
			nextn++
		}
		if strings.HasPrefix(ti.Name, "v.") || strings.HasPrefix(ti.Name, "mm.") {
			vision++
		}
	}
	f.Close()
	if nextn == 0 || vision != 0 {
		t.Errorf("text GGUF: %d nextn tensors, %d vision tensors; want some and none", nextn, vision)
	}
	// quants: each type in parts, and the mmproj.
	q := strings.Join(outs(5), " ")
	for _, want := range []string{"Q4_K_M-00001-of-", "Q6_K-00001-of-", "mmproj-"} {
		if !strings.Contains(q, want) {
			t.Errorf("quants outputs %s: no %s", q, want)
		}
	}
	// MLX: the MTP head in its side file.
	if _, err := os.Stat(filepath.Join(spec.ViewDir(spec.Stages[3]), "mtp.safetensors")); err != nil {
		t.Errorf("mlx4: %v", err)
	}
	// The gate: every artifact ok, the mmproj not applicable.
	b, err := os.ReadFile(filepath.Join(spec.ViewDir(spec.Stages[6]), "mtp-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		Results []struct {
			Path    string `json:"path"`
			Verdict string `json:"verdict"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &report); err != nil {
		t.Fatalf("mtp-report.json: %v\n%s", err, b)
	}
	ok, na := 0, 0
	for _, r := range report.Results {
		switch r.Verdict {
		case "ok":
			ok++
		case "not_applicable":
			na++
		default:
			t.Errorf("%s: verdict %s", r.Path, r.Verdict)
		}
	}
	// merged, mlx4, the f16 text GGUF, two quants; the two mmproj files.
	if ok != 5 || na != 2 {
		t.Errorf("gate: %d ok, %d not applicable; want 5 and 2\n%s", ok, na, b)
	}
	rep, err = Run(t.Context(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range rep.Stages {
		if st.Action != "skip" {
			t.Errorf("second run: %s %s", st.Stage, st.Action)
		}
	}
}
