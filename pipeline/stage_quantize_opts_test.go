package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// referenceMatrix is the reference importance matrix of model, kept in
// gguf/imatrix/testdata (ext ".gguf" or ".dat").
func referenceMatrix(t *testing.T, model, ext string) []byte {
	t.Helper()
	b, err := os.ReadFile("../gguf/imatrix/testdata/" + model + "-imatrix" + ext)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// quantizeDigest is the digest of what gguf/quantize (as `ferry quantize`
// runs it) makes of model's F16 input with o.
func quantizeDigest(t *testing.T, model string, o quantize.Options) manifest.Digest {
	t.Helper()
	f, err := gguf.Open(quantInput(t, model))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := quantize.NewPlan(f, o)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.gguf")
	if _, err := quantize.Run(context.Background(), f, p, out, quantize.RunOptions{Jobs: 1}); err != nil {
		t.Fatal(err)
	}
	d, _, err := manifest.HashFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Every option of the quantize stage reaches its output: the bytes of
// llama-quantize's golden where one was made with that option, else those
// of gguf/quantize run with the option as `ferry quantize` runs it. The
// importance matrix comes from a path (quantize.imatrix.file is the path
// as written) or from a stage's output (its file name).
func TestQuantizeStageOptions(t *testing.T) {
	q8 := quant.Q8_0
	exclude := func() *imatrix.Matrix {
		m, err := imatrix.Open("../gguf/imatrix/testdata/qwen3-imatrix.gguf")
		if err != nil {
			t.Fatal(err)
		}
		return m.Exclude([]string{"ffn"})
	}
	for _, tc := range []struct {
		name, model, params string
		golden              string           // llama-quantize's file, or
		opts                quantize.Options // what gguf/quantize makes with these
	}{
		{"tensor_types", "qwen3", "tensor_types: { attn_v: q8_0, FFN_DOWN: Q5_K }", "qwen3-base-Q4_K_M-attnv_q8_0-ffndown_q5_k", quantize.Options{}},
		{"output and embedding types", "qwen3", "output_tensor_type: q8_0, token_embedding_type: Q8_0", "qwen3-base-Q4_K_M-out_q8_0-embd_q8_0", quantize.Options{}},
		{"pure", "qwen3", "pure: true", "qwen3-base-Q4_K_M-pure", quantize.Options{}},
		{"leave_output_tensor", "qwen35", "leave_output_tensor: true", "", quantize.Options{LeaveOutput: true}},
		{"mtp_type", "qwen35", "mtp_type: q8_0", "", quantize.Options{MTPType: &q8}},
		{"imatrix path", "qwen3", "imatrix: imatrix.gguf", "qwen3-imatrix-Q4_K_M", quantize.Options{}},
		{"imatrix stage", "qwen3", "imatrix: imat", "qwen3-imatrix-Q4_K_M", quantize.Options{}},
		{"exclude_weights", "qwen3", "imatrix: ./imatrix.gguf, exclude_weights: [ffn]", "", quantize.Options{Imatrix: exclude(), ImatrixFile: "./imatrix.gguf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, filepath.Join(dir, "imatrix.gguf"), string(referenceMatrix(t, tc.model, ".gguf")))
			spec := loadSpec(t, dir, `name: q
stages:
  - name: f16
    import: { path: `+quantInput(t, tc.model)+` }
  - name: imat
    import: { path: `+filepath.Join(dir, "imatrix.gguf")+` }
  - name: quants
    quantize: { from: f16, type: Q4_K_M, `+tc.params+` }
`)
			rep, err := Run(context.Background(), spec, Options{Stages: 1, Workers: 2})
			if err != nil {
				t.Fatal(err)
			}
			outs := rep.Stages[2].Outputs
			var want manifest.Digest
			if tc.golden != "" {
				want = goldenDigest(t, tc.golden)
			} else {
				o := tc.opts
				o.FileType = quant.FileQ4_K_M
				want = quantizeDigest(t, tc.model, o)
			}
			if len(outs) != 1 || outs[0].Path != tc.model+"-base-Q4_K_M.gguf" || outs[0].Digest != want {
				t.Errorf("outputs %+v, want %s", outs, want)
			}
		})
	}
}

// The stage key holds an imatrix file's digest: the same pipeline after
// the matrix file changed (the same matrix in the .dat format) runs the
// stage again; unchanged, it is up to date. A matrix that changes after
// the pipeline file was read is refused, not used under the old key.
func TestQuantizeStageImatrixKey(t *testing.T) {
	dir := t.TempDir()
	mat := filepath.Join(dir, "m.imatrix.gguf")
	writeFile(t, mat, string(referenceMatrix(t, "qwen3", ".gguf")))
	src := `name: q
stages:
  - name: f16
    import: { path: ` + quantInput(t, "qwen3") + ` }
  - name: quants
    quantize: { from: f16, type: Q2_K_S, imatrix: m.imatrix.gguf }
`
	spec := loadSpec(t, dir, src)
	if _, err := Run(context.Background(), spec, Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), loadSpec(t, dir, src), Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "unchanged", rep, map[string]string{"quants": "skip"})
	writeFile(t, mat, string(referenceMatrix(t, "qwen3", ".dat")))
	rep, err = Run(context.Background(), loadSpec(t, dir, src), Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "changed", rep, map[string]string{"quants": "run"})

	spec = loadSpec(t, dir, src)
	writeFile(t, mat, string(referenceMatrix(t, "qwen35", ".dat")))
	if _, err := Run(context.Background(), spec, Options{Workers: 2, Force: []string{"quants"}}); err == nil || !strings.Contains(err.Error(), "changed since the pipeline file was read") {
		t.Errorf("matrix changed under a loaded pipeline: %v", err)
	}
}
