package main

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// qwen3Base is the reference Qwen3 checkpoint convert_hf_to_gguf.py read
// to make qwen3F16 (../shared/reference/qwen3/base, copied verbatim).
const qwen3Base = "../../merge/testdata/reference/qwen3/base"

// `ferry quantize --type Q6_K,Q4_K_M,Q2_K --out-dir D CHECKPOINT` writes
// llama-quantize's three files (made from convert_hf_to_gguf.py's F16
// file) under D, named after the checkpoint directory, with --json listing
// each output and its quality, and the Parquet and SVG reports; the
// single-output form takes a checkpoint too.
func TestQuantizeMultiCLI(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "quants")
	pq, svg := filepath.Join(dir, "r.parquet"), filepath.Join(dir, "r.svg")
	r := execFerry(t, nil, "quantize", "--json", "--type", "Q6_K,q4_k_m,Q2_K", "--out-dir", d, "--report", pq, "--report-svg", svg, qwen3Base, "2")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var run quantizeRun
	if err := json.Unmarshal([]byte(r.stdout), &run); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	types := []string{"Q6_K", "Q4_K_M", "Q2_K"}
	if len(run.Outputs) != len(types) {
		t.Fatalf("%d outputs: %s", len(run.Outputs), r.stdout)
	}
	for k, ty := range types {
		out := filepath.Join(d, "base-"+ty+".gguf")
		res := run.Outputs[k]
		if res.Out != out || res.Type != ty || res.Quality == nil || res.Quality.RMSE <= 0 || len(res.Quality.Worst) == 0 || res.Quality.BitsPerWeight <= 0 {
			t.Errorf("output %d: %+v", k, res)
		}
		if dg := fileDigest(t, out); hex.EncodeToString(dg[:]) != goldenSHA(t, "qwen3-base-"+ty) {
			t.Errorf("%s: sha256 %x, not llama-quantize's", out, dg)
		}
	}
	if run.Outputs[2].Quality.RMSE <= run.Outputs[0].Quality.RMSE {
		t.Errorf("Q2_K's RMSE %g is not above Q6_K's %g", run.Outputs[2].Quality.RMSE, run.Outputs[0].Quality.RMSE)
	}
	for _, p := range []string{pq, svg} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("report %s: %v", p, err)
		}
	}
	ents, _ := os.ReadDir(d)
	if len(ents) != 3 {
		t.Errorf("%d files in the output directory, want the 3 outputs", len(ents))
	}

	// The text form: each output's line and quality table.
	r = execFerry(t, nil, "quantize", "--type", "Q4_K_M", "--out-dir", filepath.Join(dir, "text"), qwen3Base)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"base-Q4_K_M.gguf: Q4_K_M (qwen3), 24 tensors (15 quantized)", "bits/weight", "worst tensors", "max abs error"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}

	// IN OUT TYPE with a checkpoint IN.
	out := filepath.Join(dir, "one.gguf")
	r = execFerry(t, nil, "quantize", qwen3Base, out, "Q6_K")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if dg := fileDigest(t, out); hex.EncodeToString(dg[:]) != goldenSHA(t, "qwen3-base-Q6_K") {
		t.Errorf("%s: sha256 %x, not llama-quantize's", out, dg)
	}
	if strings.Contains(r.stdout, "worst tensors") {
		t.Errorf("the single-output form printed a quality table without --report:\n%s", r.stdout)
	}
}

// Usage errors of the multi-output form exit 2 and write nothing.
func TestQuantizeMultiCLIErrors(t *testing.T) {
	dir := t.TempDir()
	d := filepath.Join(dir, "quants")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"--type without --out-dir", []string{"--type", "Q6_K", qwen3Base}, "--type and --out-dir go together"},
		{"--out-dir without --type", []string{"--out-dir", d, qwen3Base}, "--type and --out-dir go together"},
		{"IN OUT TYPE with --type", []string{"--type", "Q6_K", "--out-dir", d, qwen3Base, filepath.Join(dir, "x.gguf"), "Q6_K"}, "want IN [NTHREADS]"},
		{"a type twice", []string{"--type", "Q4_K_M,q4_k", "--out-dir", d, qwen3Base}, "Q4_K_M twice"},
		{"unknown type", []string{"--type", "Q6_K,Q9_K", "--out-dir", d, qwen3Base}, `"Q9_K"`},
		{"output inside the checkpoint", []string{"--type", "Q6_K", "--out-dir", filepath.Join(qwen3Base, "q"), qwen3Base}, "inside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := execFerry(t, nil, append([]string{"quantize"}, tc.args...)...)
			if r.code != exitBadInput {
				t.Errorf("exit %d, want %d: %s", r.code, exitBadInput, r.stderr)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr does not say %q: %s", tc.want, r.stderr)
			}
			if exists(d) || exists(filepath.Join(qwen3Base, "q")) {
				t.Error("the refused run made the output directory")
			}
		})
	}
}
