package quantize

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

var (
	// writeMoEInput makes TestGoldenMoEImatrix also write moeImatrixModel's
	// checkpoint and ferry's F16 GGUF of it into that folder: the inputs
	// llama.cpp's converter, llama-imatrix and llama-quantize were run on
	// (testdata/PROVENANCE.md).
	writeMoEInput = flag.String("write-moe-input", "", "also write moeImatrixModel's checkpoint and F16 GGUF into `DIR`")
	// updateMoE rewrites the dumps of testdata/golden from the files the
	// device run left in DIR (qwen35moe-imatrix-F16.gguf,
	// imatrix/imatrix-FORMAT-TYPE.gguf).
	updateMoE = flag.String("update-moe", "", "rewrite testdata/golden's MoE imatrix dumps from the llama.cpp outputs in `DIR`")
)

// moeImatrixModel is the tiny Qwen3.5-MoE model of the MoE imatrix
// goldens: rows of 256 (hidden, expert and shared-expert widths) so every
// matrix takes a K type, one linear-attention and one full-attention
// layer, each with 4 experts of which 2 are routed per token, no MTP block.
var moeImatrixModel = testmodel.Qwen35MoEOptions{
	Common: testmodel.Common{
		Seed: 2705, VocabSize: 512, HiddenSize: 256, IntermediateSize: 512, NumLayers: 2,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 128, MaxShardSize: 1 << 20,
	},
	Hybrid: testmodel.Hybrid{FullAttentionInterval: 2, LinearKeyHeadDim: 64, LinearValueHeadDim: 64, NoMTP: true},
	MoE:    testmodel.MoE{NumExperts: 4, NumExpertsPerTok: 2, MoEIntermediateSize: 256, SharedExpertIntermediateSize: 256},
}

// moeImatrixTypes are the file types llama-quantize made from the model's
// F16 file with each matrix.
var moeImatrixTypes = []string{"Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K"}

// moeTestdata holds this package's goldens: the dumps of llama-quantize's
// outputs on moeImatrixModel and its logs.
const moeTestdata = "testdata"

// moeF16 writes model's checkpoint into dir/name and converts it with
// gguf/convert (--no-mtp, as convert_hf_to_gguf.py needs for a Qwen3.5
// config without MTP layers) to dir/name-F16.gguf, returned.
func moeF16(t *testing.T, dir, name string, model testmodel.Qwen35MoEOptions) string {
	t.Helper()
	ckDir := filepath.Join(dir, name)
	if _, err := model.Write(ckDir); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(ckDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cp, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16, NoMTP: true})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(dir, name+"-F16.gguf")
	if err := convert.Write(context.Background(), cp, in, convert.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return in
}

// updateDump rewrites the dump at golden from dir/rel, the file's name in
// the dump being rel, unless dir is empty.
func updateDump(t *testing.T, dir, golden, rel string) {
	t.Helper()
	if dir == "" {
		return
	}
	g, err := goldenfile.Dump(filepath.Join(dir, rel), rel)
	if err != nil {
		t.Fatal(err)
	}
	if err := goldenfile.Save(golden, g); err != nil {
		t.Fatal(err)
	}
}

// A Qwen3.5-MoE model (3-D expert tensors, each expert with its own
// importance vector) quantized with the legacy .dat matrix and with the
// GGUF one of the same llama-imatrix run: byte for byte what llama-quantize
// made from each. The two matrices give different files there: the .dat
// holds (in_sum2 / count) · ncall and the loader divides by ncall again,
// which for an expert's token count that is not a power of two is not
// in_sum2 / count in float32. The F16 input is ferry's conversion, the same
// bytes as convert_hf_to_gguf.py's (checked against its dump).
func TestGoldenMoEImatrix(t *testing.T) {
	moeGolden(t, moeGoldenSet{
		name: "qwen35moe-imatrix", model: moeImatrixModel, logs: filepath.Join(moeTestdata, "logs"),
		writeInput: *writeMoEInput, update: *updateMoE,
	})
}

// moeGoldenSet is one model's MoE imatrix goldens: the checkpoint
// (model), its F16 dump testdata/golden/NAME-F16.json, the matrices
// ../imatrix/testdata/NAME.{dat,gguf}, llama-quantize's outputs' dumps
// testdata/golden/NAME-FORMAT-TYPE.json for every moeImatrixTypes and
// its logs LOGS/quantize_imatrix_FORMAT_TYPE.log.
type moeGoldenSet struct {
	name       string
	model      testmodel.Qwen35MoEOptions
	logs       string
	writeInput string // -write-…-input: where the checkpoint and F16 go
	update     string // -update-…: the device run's folder to dump
}

// moeGolden quantizes the set's F16 (ferry's conversion, the same bytes
// as convert_hf_to_gguf.py's: checked against its dump) with each matrix
// to each type and requires llama-quantize's file byte for byte, and the
// tensors it quantized without weights to be those it logged.
func moeGolden(t *testing.T, s moeGoldenSet) {
	dir := t.TempDir()
	if s.writeInput != "" {
		dir = s.writeInput
	}
	in := moeF16(t, dir, s.name, s.model)
	f16Golden := filepath.Join(moeTestdata, "golden", s.name+"-F16.json")
	updateDump(t, s.update, f16Golden, s.name+"-F16.gguf")
	want, err := goldenfile.Load(f16Golden)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := goldenfile.Dump(in, ""); err != nil || got.SHA256 != want.SHA256 || got.Size != want.Size {
		t.Fatalf("the F16 input is not the one llama.cpp's converter wrote (%v)", err)
	}
	for _, format := range []string{"dat", "gguf"} {
		m := openMatrix(t, filepath.Join("..", "imatrix", "testdata", s.name+"."+format))
		for _, typ := range moeImatrixTypes {
			t.Run(format+"-"+typ, func(t *testing.T) {
				ft, err := ParseType(typ)
				if err != nil {
					t.Fatal(err)
				}
				name := "imatrix-" + format + "-" + typ
				golden := filepath.Join(moeTestdata, "golden", s.name+"-"+format+"-"+typ+".json")
				updateDump(t, s.update, golden, filepath.Join("imatrix", name+".gguf"))
				out := filepath.Join(t.TempDir(), "out.gguf")
				// The .dat runs' chunks of 300 rows straddle the
				// experts' boundaries (256 rows each).
				chunk := int64(1 << 13)
				if format == "dat" {
					chunk = 300 * 256
				}
				p, _ := goldenRun(t, in, out, golden, Options{FileType: ft, Imatrix: m, ImatrixFile: "imatrix." + format}, chunk)
				b, err := os.ReadFile(filepath.Join(s.logs, "quantize_imatrix_"+format+"_"+typ+".log"))
				if err != nil {
					t.Fatal(err)
				}
				var unweighted []string
				for _, line := range strings.Split(string(b), "\n") {
					if _, n, ok := strings.Cut(line, "====== llama_model_quantize_impl: did not find weights for "); ok {
						unweighted = append(unweighted, strings.TrimSpace(n))
					}
				}
				if strings.Join(p.Unweighted, " ") != strings.Join(unweighted, " ") || len(unweighted) == 0 {
					t.Errorf("unweighted %q, llama-quantize's log %q", p.Unweighted, unweighted)
				}
			})
		}
	}
}

// llama-quantize's own files from the .dat and from the GGUF matrix of the
// same run differ in expert tensors, and only there (same layout, same
// metadata but quantize.imatrix.file): the .dat's round trip through ncall
// is exact for the dense entries (ncall 64, a power of two) and not for
// the experts' (ncall 36 and 39). So a .dat run must be checked against a
// golden made from the .dat; TestGoldenImatrix's dense models are the case
// where the GGUF golden serves both.
func TestMoEImatrixFormatsDiffer(t *testing.T) {
	for _, typ := range moeImatrixTypes {
		d, err := goldenfile.Load(filepath.Join(moeTestdata, "golden", "qwen35moe-imatrix-dat-"+typ+".json"))
		if err != nil {
			t.Fatal(err)
		}
		g, err := goldenfile.Load(filepath.Join(moeTestdata, "golden", "qwen35moe-imatrix-gguf-"+typ+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if d.Size != g.Size || len(d.KVs) != len(g.KVs) || len(d.Tensors) != len(g.Tensors) {
			t.Fatalf("%s: %d bytes, %d KVs, %d tensors from the .dat; %d, %d, %d from the GGUF", typ, d.Size, len(d.KVs), len(d.Tensors), g.Size, len(g.KVs), len(g.Tensors))
		}
		for i, kv := range d.KVs {
			if o := g.KVs[i]; kv.Key != o.Key || (string(kv.Value) != string(o.Value)) != (kv.Key == "quantize.imatrix.file") {
				t.Errorf("%s: KV %s %s, from the GGUF %s %s", typ, kv.Key, kv.Value, o.Key, o.Value)
			}
		}
		var differ []string
		for i, ti := range d.Tensors {
			o := g.Tensors[i]
			if ti.Name != o.Name || ti.Type != o.Type || ti.Offset != o.Offset {
				t.Errorf("%s: tensor %d %s %s @%d, from the GGUF %s %s @%d", typ, i, ti.Name, ti.Type, ti.Offset, o.Name, o.Type, o.Offset)
			}
			if ti.SHA256 != o.SHA256 {
				differ = append(differ, ti.Name)
				if !strings.Contains(ti.Name, "_exps.") {
					t.Errorf("%s: %s differs between the formats", typ, ti.Name)
				}
			}
		}
		if len(differ) == 0 {
			t.Errorf("%s: the same tensors from both formats", typ)
		}
	}
}
