package quantize

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/internal/ggufcheck"
	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/verify"
)

// quantTestdata is gguf/quant's testdata: the reference F16 inputs and the
// dumps of llama-quantize's outputs made from them.
const quantTestdata = "../quant/testdata"

func input(model string) string { return filepath.Join(quantTestdata, model+"-base-F16.gguf") }

func typePtr(t quant.Type) *quant.Type { return &t }

// goldens are the llama-quantize outputs (llama.cpp 34af94c, no imatrix)
// and the options that made them (gguf/quant/testdata/logs).
var goldens = []struct {
	model, name, ftype string
	opts               Options
}{
	{"qwen3", "Q8_0", "Q8_0", Options{}},
	{"qwen3", "Q6_K", "Q6_K", Options{}},
	{"qwen3", "Q5_K_M", "Q5_K_M", Options{}},
	{"qwen3", "Q5_K_S", "Q5_K_S", Options{}},
	{"qwen3", "Q4_K_M", "Q4_K_M", Options{}},
	{"qwen3", "Q4_K_S", "Q4_K_S", Options{}},
	{"qwen3", "Q3_K_L", "Q3_K_L", Options{}},
	{"qwen3", "Q3_K_M", "Q3_K_M", Options{}},
	{"qwen3", "Q3_K_S", "Q3_K_S", Options{}},
	{"qwen3", "Q2_K", "Q2_K", Options{}},
	{"qwen3", "Q4_K_M-out_q8_0-embd_q8_0", "Q4_K_M", Options{OutputType: typePtr(quant.Q8_0), TokenEmbdType: typePtr(quant.Q8_0)}},
	{"qwen3", "Q4_K_M-pure", "Q4_K_M", Options{Pure: true}},
	{"qwen3", "Q4_K_M-attnv_q8_0-ffndown_q5_k", "Q4_K_M", Options{TensorTypes: []quant.TensorType{{Pattern: "attn_v", Type: quant.Q8_0}, {Pattern: "ffn_down", Type: quant.Q5_K}}}},
	{"qwen35", "Q6_K", "Q6_K", Options{}},
	{"qwen35", "Q5_K_M", "Q5_K_M", Options{}},
	{"qwen35", "Q4_K_M", "Q4_K_M", Options{}},
	{"qwen35", "Q3_K_M", "Q3_K_M", Options{}},
	{"qwen35", "Q2_K", "Q2_K", Options{}},
}

// quantizeFile runs NewPlan and Run on in into out.
func quantizeFile(t testing.TB, in, out string, o Options, ro RunOptions) *Plan {
	t.Helper()
	f, err := gguf.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := NewPlan(f, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), f, p, out, ro); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every llama-quantize golden: our output is the same file, byte for byte
// (its whole-file sha256 and size), and gguf-parser-go reads it as ferry's
// reader does. On a mismatch the first differing KV or tensor is named.
func TestGolden(t *testing.T) {
	for _, g := range goldens {
		t.Run(g.model+"-"+g.name, func(t *testing.T) {
			ft, err := ParseType(g.ftype)
			if err != nil {
				t.Fatal(err)
			}
			o := g.opts
			o.FileType = ft
			out := filepath.Join(t.TempDir(), "out.gguf")
			if _, same := goldenRun(t, input(g.model), out, filepath.Join(quantTestdata, "golden", g.model+"-base-"+g.name+".json"), o, 1<<14); same {
				if err := ggufcheck.Check(out); err != nil {
					t.Error(err)
				}
			}
			requireMTP(t, out)
		})
	}
}

// goldenRun quantizes in into out with o and compares the whole file with
// the dump at golden (sha256 and size), naming the first differences.
func goldenRun(t *testing.T, in, out, golden string, o Options, chunk int64) (p *Plan, same bool) {
	t.Helper()
	want, err := goldenfile.Load(golden)
	if err != nil {
		t.Fatal(err)
	}
	p = quantizeFile(t, in, out, o, RunOptions{Jobs: 2, ChunkElems: chunk})
	got, err := goldenfile.Dump(out, "")
	if err != nil {
		t.Fatal(err)
	}
	if got.SHA256 == want.SHA256 && got.Size == want.Size {
		return p, true
	}
	t.Errorf("sha256 %s (%d bytes), llama-quantize's %s (%d bytes)", got.SHA256, got.Size, want.SHA256, want.Size)
	diffDump(t, got, want)
	return p, false
}

// diffDump names the first few differences between two dumps.
func diffDump(t *testing.T, got, want *goldenfile.File) {
	t.Helper()
	if len(got.KVs) != len(want.KVs) {
		t.Errorf("%d KVs, want %d", len(got.KVs), len(want.KVs))
	}
	for i := range min(len(got.KVs), len(want.KVs)) {
		a, b := got.KVs[i], want.KVs[i]
		if a.Key != b.Key || a.Type != b.Type || string(a.Value) != string(b.Value) {
			t.Errorf("KV %d: %s %s %.60s, want %s %s %.60s", i, a.Key, a.Type, a.Value, b.Key, b.Type, b.Value)
			break
		}
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Errorf("%d tensors, want %d", len(got.Tensors), len(want.Tensors))
	}
	n := 0
	for i := range min(len(got.Tensors), len(want.Tensors)) {
		a, b := got.Tensors[i], want.Tensors[i]
		if a.Name != b.Name || a.Type != b.Type || a.Offset != b.Offset || a.SHA256 != b.SHA256 || len(a.Dims) != len(b.Dims) {
			t.Errorf("tensor %d: %s %s %v @%d %.12s, want %s %s %v @%d %.12s", i, a.Name, a.Type, a.Dims, a.Offset, a.SHA256, b.Name, b.Type, b.Dims, b.Offset, b.SHA256)
			if n++; n == 5 {
				break
			}
		}
	}
}

// familyTypes are the file types llama-quantize was run with on every
// model of testmodel.QuantizerFamilies (gguf/quant's FamilyTypes), and
// legacyTypes those it was also run with on the two reference inputs.
var (
	familyTypes = []string{"Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}
	legacyTypes = []string{"Q4_0", "Q4_1", "Q5_0", "Q5_1"}
)

// compareGolden quantizes in as ftype and compares the whole file with the
// dump at golden.
func compareGolden(t *testing.T, in, golden, ftype string) {
	t.Helper()
	ft, err := ParseType(ftype)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.gguf")
	goldenRun(t, in, out, golden, Options{FileType: ft}, 1<<12)
	requireMTP(t, out)
}

// requireMTP checks the MTP head of a quantized file whose header promises
// one as `ferry verify mtp --require --deep` does.
func requireMTP(t *testing.T, out string) {
	t.Helper()
	rep, err := verify.MTP(out, verify.Options{Require: true, Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Promised > 0 && !rep.Pass(true) {
		t.Errorf("verify mtp --require --deep: %s: %+v", rep.Verdict, rep)
	}
}

// The legacy types on the two reference inputs, byte-identical to
// llama-quantize's files.
func TestGoldenLegacy(t *testing.T) {
	for _, model := range []string{"qwen3", "qwen35"} {
		for _, typ := range legacyTypes {
			t.Run(model+"-"+typ, func(t *testing.T) {
				compareGolden(t, input(model), filepath.Join(quantTestdata, "golden", "families", model+"-"+typ+".json"), typ)
			})
		}
	}
}

// Every model of testmodel.QuantizerFamilies (every converter family, rows
// that need the legacy fallbacks, MoE with stacked and fused experts, MTP
// with experts, nine layers with GQA 4, rows of 80), converted to F16 by
// gguf/convert (checked against the dump of the F16 file llama-quantize
// read) and quantized to every family type: the bytes of llama-quantize's
// output, or a refusal before anything is written where llama-quantize
// refused (refused.json).
func TestGoldenFamilies(t *testing.T) {
	dir := filepath.Join(quantTestdata, "golden", "families")
	b, err := os.ReadFile(filepath.Join(dir, "refused.json"))
	if err != nil {
		t.Fatal(err)
	}
	var refused map[string]string
	if err := json.Unmarshal(b, &refused); err != nil {
		t.Fatal(err)
	}
	models := slices.Sorted(maps.Keys(testmodel.QuantizerFamilies))
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			in := familyF16(t, t.TempDir(), model)
			want, err := goldenfile.Load(filepath.Join(dir, model+"-F16.json"))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := goldenfile.Dump(in, ""); err != nil || got.SHA256 != want.SHA256 {
				t.Fatalf("the F16 input is not the one llama-quantize read (%v)", err)
			}
			for _, typ := range familyTypes {
				t.Run(typ, func(t *testing.T) {
					if why, ok := refused[model+"-"+typ]; ok {
						ft, err := ParseType(typ)
						if err != nil {
							t.Fatal(err)
						}
						_, _, err = plan(t, in, Options{FileType: ft})
						if err == nil {
							t.Fatalf("planned; llama-quantize refused: %s", why)
						}
						if k := errkind.Of(err); k != errkind.Usage && k != errkind.BadInput {
							t.Errorf("refused as %s (exit %v): %v", k, k, err)
						}
						return
					}
					compareGolden(t, in, filepath.Join(dir, model+"-"+typ+".json"), typ)
				})
			}
		})
	}
}

// familyF16 writes testmodel.QuantizerFamilies' model as a checkpoint in
// dir/model (general.name comes from it) and converts it with
// gguf/convert to dir/model-F16.gguf, returned.
func familyF16(t *testing.T, dir, model string) string {
	t.Helper()
	ckDir := filepath.Join(dir, model)
	if _, err := testmodel.QuantizerFamilies[model](ckDir); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(ckDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cp, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, model+"-F16.gguf")
	if err := convert.Write(context.Background(), cp, in, convert.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return in
}
