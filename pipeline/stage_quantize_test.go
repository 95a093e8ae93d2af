package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// quantInput is the reference F16 GGUF llama-quantize's goldens were made
// from, and goldenDigest the digest of one of them.
func quantInput(t *testing.T, model string) string {
	t.Helper()
	p, err := filepath.Abs("../gguf/quant/testdata/" + model + "-base-F16.gguf")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func goldenDigest(t *testing.T, name string) manifest.Digest {
	t.Helper()
	b, err := os.ReadFile("../gguf/quant/testdata/golden/" + name + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct{ SHA256 string }
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return manifest.Digest("sha256:" + g.SHA256)
}

type stageProgress struct {
	stage string
	p     Progress
}

func (s stageProgress) of(stage string) Progress {
	if stage == s.stage {
		return s.p
	}
	return nopProgress{}
}

type nopProgress struct{}

func (nopProgress) SetTotal(int64) {}
func (nopProgress) Add(int64)      {}

// The quantize stage's outputs are llama-quantize's files, byte for byte,
// named after the input with their types, and recorded in the manifest;
// also when the stage was cancelled halfway (all its outputs are made in
// one read) and resumed, and straight from a checkpoint stage (the one
// convert_hf_to_gguf.py made the goldens' F16 input from), with the
// quality report as two more outputs.
func TestQuantizeStage(t *testing.T) {
	ckpt, err := filepath.Abs("../testdata/models/qwen35-tiny/base")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, in, from, params, stem string
		types                        []string
		cancelAt                     int64
		report                       bool
	}{
		{"type", quantInput(t, "qwen35"), "f16", "type: q4_k", "qwen35-base", []string{"Q4_K_M"}, 0, false},
		{"types, cancelled", quantInput(t, "qwen35"), "f16", "types: [Q6_K, Q4_K_M]", "qwen35-base", []string{"Q6_K", "Q4_K_M"}, 4 << 20, false},
		{"checkpoint, report, cancelled", ckpt, "base", "types: [Q6_K, Q4_K_M, Q2_K], report: true", "base", []string{"Q6_K", "Q4_K_M", "Q2_K"}, 3 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			spec := loadSpec(t, dir, `name: q
stages:
  - name: `+tc.from+`
    import: { path: `+tc.in+` }
  - name: quants
    quantize: { from: `+tc.from+`, `+tc.params+` }
`)
			if tc.cancelAt > 0 {
				ctx, cancel := context.WithCancel(context.Background())
				sp := stageProgress{"quants", &cancelAfter{n: tc.cancelAt, cancel: cancel}}
				_, err := Run(ctx, spec, Options{Stages: 1, Workers: 1, Progress: sp.of})
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled run: %v", err)
				}
			}
			rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			outs := rep.Stages[1].Outputs
			s, err := manifest.Load(spec.Store)
			if err != nil {
				t.Fatal(err)
			}
			rec := s.StageRecord("q", "quants")
			want := len(tc.types)
			if tc.report {
				want += 2
			}
			if len(outs) != want || rec == nil || len(rec.Outputs) != want {
				t.Fatalf("outputs %+v, record %+v; want %v (and the report: %v)", outs, rec, tc.types, tc.report)
			}
			got := map[string]manifest.Digest{}
			for i := range outs {
				got[outs[i].Path] = outs[i].Digest
				if rec.Outputs[i] != outs[i] {
					t.Errorf("output %+v recorded as %+v", outs[i], rec.Outputs[i])
				}
			}
			for _, typ := range tc.types {
				name := tc.stem + "-" + typ + ".gguf"
				if want := goldenDigest(t, "qwen35-base-"+typ); got[name] != want {
					t.Errorf("%s: %s, want %s (outputs %+v)", name, got[name], want, outs)
				}
			}
			if tc.report {
				for _, name := range []string{tc.stem + "-report.parquet", tc.stem + "-report.svg"} {
					if got[name] == "" {
						t.Errorf("no %s among the outputs %+v", name, outs)
					}
				}
			}
		})
	}
}

// With model_name, a quantize stage straight from a checkpoint makes what
// a gguf stage with that model_name followed by a quantize stage makes:
// the same names and bytes (llama-quantize's goldens: the reference F16
// was converted from a directory named base), planned before anything
// runs with those names; model_name on a GGUF input is refused.
func TestQuantizeStageModelName(t *testing.T) {
	ckpt, err := filepath.Abs("../testdata/models/qwen35-tiny/base")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := loadSpecKinds(t, dir, `name: q
stages:
  - name: ck
    import: { path: `+ckpt+` }
  - name: f16
    gguf: { from: ck, model_name: base }
  - name: twostep
    quantize: { from: f16, types: [Q6_K, Q4_K_M] }
  - name: direct
    quantize: { from: ck, model_name: base, types: [Q6_K, Q4_K_M] }
`, BuiltinKinds())
	plan, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var planned string
	for _, st := range plan.Stages {
		if st.Stage == "direct" {
			planned = st.Plan
		}
	}
	rep, err := Run(context.Background(), spec, Options{Stages: 4, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string][]manifest.Output{}
	for _, st := range rep.Stages {
		outs[st.Stage] = st.Outputs
	}
	f16 := outs["f16"][0].Path
	stem := strings.TrimSuffix(f16, "-F16.gguf")
	if len(outs["direct"]) != 2 || len(outs["twostep"]) != 2 {
		t.Fatalf("outputs: direct %+v, twostep %+v", outs["direct"], outs["twostep"])
	}
	if !strings.Contains(planned, stem+"-Q6_K.gguf") || !strings.Contains(planned, stem+"-Q4_K_M.gguf") {
		t.Errorf("plan of direct: %q, want the outputs named after %s", planned, f16)
	}
	got := map[string]manifest.Digest{}
	for i, o := range outs["direct"] {
		if o != outs["twostep"][i] {
			t.Errorf("direct made %+v, the F16 file then quantize %+v", o, outs["twostep"][i])
		}
		got[o.Path] = o.Digest
	}
	for _, typ := range []string{"Q6_K", "Q4_K_M"} {
		name := stem + "-" + typ + ".gguf"
		if want := goldenDigest(t, "qwen35-base-"+typ); got[name] != want {
			t.Errorf("%s: %s, want llama-quantize's %s (outputs %+v)", name, got[name], want, outs["direct"])
		}
	}

	bad := loadSpecKinds(t, t.TempDir(), `name: q
stages:
  - name: f16
    import: { path: `+quantInput(t, "qwen35")+` }
  - name: quants
    quantize: { from: f16, model_name: x, type: Q8_0 }
`, BuiltinKinds())
	if _, err := Run(context.Background(), bad, Options{}); err == nil || !strings.Contains(err.Error(), "model_name") {
		t.Errorf("model_name on a GGUF input: %v, want it refused", err)
	}
}

// A bad type is refused when the pipeline file is parsed; an input the
// quantizer refuses (NextN layers promised, their tensors missing) by
// plan, before any stage runs.
func TestQuantizeStageRefusals(t *testing.T) {
	for _, tc := range []struct{ params, want string }{
		{"type: Q9_K", `"Q9_K"`},
		{"types: [Q4_K_M, q4_k_m]", "twice"},
		{"type: Q8_0, types: [Q6_K]", "not both"},
		{"type: Q2_K_S", "importance matrix"},
		{"type: Q8_0, output_tensor_type: q9", "output_tensor_type"},
		{"types: []", "empty"},
		{"type: Q4_K_M, tensor_types: [attn_v]", "mapping"},
		{"type: Q4_K_M, tensor_types: { attn_v: q9_k }", `"q9_k"`},
		{"type: Q4_K_M, tensor_types: { 'attn_(v': q8_0 }", "attn_(v"},
		{"type: Q4_K_M, mtp_type: iq2_xs", "mtp_type"},
		{"type: Q4_K_M, imatrix: nope.gguf", "nope.gguf"},
		{"type: Q4_K_M, imatrix: f16, include_weights: [a], exclude_weights: [b]", "cannot be used together"},
		{"type: Q4_K_M, exclude_weights: [b]", "no imatrix given"},
		{"type: Q4_K_M, imatrix: nosuchstage", "nosuchstage"},
		{"type: Q4_K_M, model_name: a/b", "plain name"},
	} {
		dir := t.TempDir()
		p := filepath.Join(dir, "p.yaml")
		writeFile(t, p, "name: q\nstages:\n  - name: f16\n    import: { path: x.gguf }\n  - name: quants\n    quantize: { from: f16, "+tc.params+" }\n")
		if _, err := Load(p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.params, err, tc.want)
		}
	}

	dir := t.TempDir()
	// qwen35's F16 input (nextn_predict_layers 1) with its NextN block's
	// eh_proj renamed away.
	src, err := os.ReadFile(quantInput(t, "qwen35"))
	if err != nil {
		t.Fatal(err)
	}
	// Imported as a directory: its plan previews the files, so the
	// quantize stage is planned before the import runs.
	bad := filepath.Join(dir, "in", "bad-F16.gguf")
	writeFile(t, bad, strings.Replace(string(src), "blk.4.nextn.eh_proj.weight", "blk.4.nextn.eh_prox.weight", 1))
	spec := loadSpecKinds(t, dir, `name: q
stages:
  - name: f16
    import: { path: in }
  - name: quants
    quantize: { from: f16, type: Q8_0 }
`, BuiltinKinds())
	rep, err := Plan(spec, Options{})
	if err == nil || !strings.Contains(err.Error(), "blk.4.nextn.eh_proj.weight") {
		t.Fatalf("plan: %v, want the missing nextn tensor named", err)
	}
	wantActions(t, "plan", rep, map[string]string{"quants": "invalid"})
	if _, err := Run(context.Background(), spec, Options{}); err == nil {
		t.Fatal("run of a pipeline plan refuses: no error")
	}
	if s, _ := manifest.Load(spec.Store); s != nil && s.StageRecord("q", "f16") != nil {
		t.Error("the import ran although a later stage's plan refused")
	}
}
