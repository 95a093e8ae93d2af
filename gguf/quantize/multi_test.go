package quantize

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
)

// The reference checkpoints, in the repository: the directories
// convert_hf_to_gguf.py read to make the F16 inputs of the goldens
// (../shared/reference/MODEL/base, copied verbatim).
var checkpoints = map[string]string{
	"qwen3":  "../../merge/testdata/reference/qwen3/base",
	"qwen35": "../../testdata/models/qwen35-tiny/base",
}

// quantizeMulti plans every type of src and makes them in one RunMulti
// into dir, named as `ferry quantize --out-dir` names them.
func quantizeMulti(t testing.TB, src string, so SourceOptions, types []string, dir string, ro RunOptions) ([]Output, []*RunResult) {
	t.Helper()
	s, err := OpenSource(src, so)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var outs []Output
	for _, name := range types {
		ft, err := ParseType(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.NewPlan(Options{FileType: ft})
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, Output{Plan: p, Path: filepath.Join(dir, OutputName(s.Stem(), ft))})
	}
	rs, err := RunMulti(context.Background(), s.File, outs, ro)
	if err != nil {
		t.Fatal(err)
	}
	return outs, rs
}

// checkGolden compares the file at path with the dump of llama-quantize's
// output MODEL-base-NAME.
func checkGolden(t *testing.T, path, model, name string) {
	t.Helper()
	want, err := goldenfile.Load(filepath.Join(quantTestdata, "golden", model+"-base-"+name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := goldenfile.Dump(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if got.SHA256 != want.SHA256 || got.Size != want.Size {
		t.Errorf("%s: sha256 %s (%d bytes), llama-quantize's %s (%d bytes)", path, got.SHA256, got.Size, want.SHA256, want.Size)
		diffDump(t, got, want)
	}
}

// Straight from safetensors, three types in one read: each output is
// byte-identical to llama-quantize's from convert_hf_to_gguf.py's F16
// file, for both reference models (Qwen3.5 with its MTP block), and the
// same from the F16 GGUF file itself.
func TestMultiGolden(t *testing.T) {
	types := []string{"Q6_K", "Q4_K_M", "Q2_K"}
	for _, model := range []string{"qwen3", "qwen35"} {
		for _, src := range []string{checkpoints[model], input(model)} {
			t.Run(model+"/"+filepath.Base(src), func(t *testing.T) {
				dir := t.TempDir()
				outs, rs := quantizeMulti(t, src, SourceOptions{}, types, dir, RunOptions{Jobs: 3, ChunkElems: 1 << 13, Errors: true})
				for k, out := range outs {
					stem := "base" // the checkpoint directory's name
					if filepath.Ext(src) == ".gguf" {
						stem = model + "-base" // MODEL-base-F16.gguf
					}
					if want := filepath.Join(dir, stem+"-"+types[k]+".gguf"); out.Path != want {
						t.Errorf("output %s, want %s", out.Path, want)
					}
					checkGolden(t, out.Path, model, types[k])
					requireMTP(t, out.Path)
					if len(rs[k].Errors) != len(out.Plan.Tensors) {
						t.Errorf("%s: %d tensor errors for %d tensors", out.Path, len(rs[k].Errors), len(out.Plan.Tensors))
					}
				}
			})
		}
	}
}

// The measured errors, like the bytes, do not depend on the worker count:
// each unit's sums are added up in unit order.
func TestMultiErrorsDeterministic(t *testing.T) {
	types := []string{"Q4_K_M", "Q2_K"}
	var ref []*RunResult
	for _, jobs := range []int{1, 4} {
		_, rs := quantizeMulti(t, checkpoints["qwen3"], SourceOptions{}, types, t.TempDir(), RunOptions{Jobs: jobs, ChunkElems: 1 << 12, Errors: true})
		if ref == nil {
			ref = rs
			continue
		}
		for k := range rs {
			if !slices.Equal(rs[k].Errors, ref[k].Errors) {
				t.Errorf("%s: the errors with %d jobs differ from those with 1", types[k], jobs)
			}
		}
	}
}
