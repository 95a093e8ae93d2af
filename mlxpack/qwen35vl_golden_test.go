package mlxpack

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// qwen35VLBase is ../shared/reference/qwen35vl/base, copied verbatim
// (testdata/models/qwen35vl-tiny/PROVENANCE.md): the
// Qwen3_5ForConditionalGeneration layout (text_config, vision_config,
// model.language_model.*, model.visual.*, lm_head, mtp.*).
const qwen35VLBase = "../testdata/models/qwen35vl-tiny/base"

// vlInventory is testdata/qwen35vl_mlx/inventory.json: per output
// directory, every file's size and sha256, and model.safetensors' header
// metadata and tensors ([dtype, shape, sha256 of the bytes]).
type vlInventory map[string]map[string]struct {
	Size     int64                         `json:"size"`
	SHA256   string                        `json:"sha256"`
	Metadata map[string]string             `json:"metadata"`
	Tensors  map[string][3]json.RawMessage `json:"tensors"`
}

// vlGoldenSets are mlx-lm 0.32.0's own conversions of vision-language
// checkpoints, under testdata/qwen35vl_mlx (PROVENANCE.md there): the
// reference Qwen3_5ForConditionalGeneration, and two
// Qwen3_5MoeForConditionalGeneration checkpoints of testmodel's (fused
// experts; widths 64, and the default 32, at which the experts' down_proj
// does not divide by the group and stays bf16), regenerated here and
// checked against the sha256 of the files the device converted.
var vlGoldenSets = []struct {
	name string // directory under testdata/qwen35vl_mlx ("" for the top)
	inv  string // inventory key prefix
	src  func(t *testing.T) string
}{
	{"", "qwen35vl_", func(*testing.T) string { return qwen35VLBase }},
	{"moevl", "moevl_", func(t *testing.T) string { return moeVLBase(t, "moevl", testmodel.Qwen35MoEVLDevice) }},
	{"moevl_i32", "moevl_", func(t *testing.T) string {
		return moeVLBase(t, "moevl_i32", testmodel.Qwen35MoEOptions{Common: testmodel.Common{Seed: 5}, MoE: testmodel.MoE{FusedExperts: true}})
	}},
}

// moeVLBase writes the MoE set and checks its base is, file for file, the
// one the device run converted (testdata/qwen35vl_mlx/SET/base.sha256).
func moeVLBase(t *testing.T, set string, o testmodel.Qwen35MoEOptions) string {
	t.Helper()
	vs, err := testmodel.Qwen35MoEVL(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	base := vs.Base.Dir
	for _, line := range strings.Split(strings.TrimSpace(string(mustRead(t, filepath.Join("testdata/qwen35vl_mlx", set, "base.sha256")))), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("base.sha256: line %q", line)
		}
		if got := sha256hex(mustRead(t, filepath.Join(base, strings.TrimPrefix(name, "base/")))); got != sum {
			t.Fatalf("testmodel's %s is no longer the checkpoint mlx-lm converted (%s: sha256 %s, was %s)", set, name, got, sum)
		}
	}
	return base
}

// TestQwen35VLGolden converts each vision-language checkpoint as mlx-lm
// 0.32.0's convert did (bf16, and -q group 64 bits 4) and holds ferry's
// output to every file of that golden:
//   - model.safetensors: the same tensors, names, dtypes, shapes and bytes
//     (every one of them), no model.visual.* (sanitize drops the vision
//     tower), no mtp.*, header metadata {"format": "mlx"}. The file as a
//     whole is not compared: MLX writes the tensor data in its
//     unordered_map's order and ferry in mlx-lm's parameter order, which
//     mlx-lm's loader does not see;
//   - model.safetensors.index.json, generation_config.json, README.md:
//     byte for byte;
//   - config.json: byte for byte but for what ferry records on purpose (the
//     dropped head: text_config.mtp_num_hidden_layers 0 where mlx-lm keeps
//     promising 1, and the ferry_mtp_dropped record), so nested text_config
//     in its source order, rope_parameters' "type" at its end, no
//     vision_config, eos_token_id from generation_config.json, the
//     quantization block (the MoE's router gates at 8 bits) twice;
//   - tokenizer.json, tokenizer_config.json, chat_template.jinja: mlx-lm
//     re-saves the tokenizer through transformers (which writes the chat
//     template to its own file and adds is_local/local_files_only, facts of
//     the machine), ferry copies the source's files as they are: they must
//     be the same tokenizer (vocabulary, merges, added tokens, pipeline,
//     special tokens) with the same chat template;
//   - no other file: mlx-lm copies no preprocessor_config.json, nor does
//     ferry.
//
// Every golden file is first checked against the inventory's sha256, so
// the testdata is what the device run wrote.
func TestQwen35VLGolden(t *testing.T) {
	for _, set := range vlGoldenSets {
		gdir := filepath.Join("testdata/qwen35vl_mlx", set.name)
		var inv vlInventory
		if err := json.Unmarshal(mustRead(t, filepath.Join(gdir, "inventory.json")), &inv); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			opts QuantizeOptions
		}{
			{"bf16", QuantizeOptions{}},
			{"g64_b4", QuantizeOptions{Bits: 4, GroupSize: 64}},
		} {
			t.Run(filepath.Join(set.name, c.name), func(t *testing.T) {
				want := inv[set.inv+c.name]
				if len(want) == 0 {
					t.Fatalf("inventory has no %s%s", set.inv, c.name)
				}
				golden := filepath.Join(gdir, c.name)
				for f, w := range want {
					if f == "model.safetensors" {
						continue
					}
					if got := sha256hex(mustRead(t, filepath.Join(golden, f))); got != w.SHA256 {
						t.Fatalf("%s/%s: sha256 %s, the inventory says %s", golden, f, got, w.SHA256)
					}
				}
				src := set.src(t)
				out := filepath.Join(t.TempDir(), "mlx")
				convertTo(t, src, out, c.opts, QuantizeRunOptions{Jobs: 2})

				// Files: mlx-lm's, less the chat template transformers split
				// out (ferry's copied tokenizer_config.json carries it).
				var wantFiles []string
				for f := range want {
					if f != "chat_template.jinja" {
						wantFiles = append(wantFiles, f)
					}
				}
				slices.Sort(wantFiles)
				if got := resFiles(t, out); !slices.Equal(got, wantFiles) {
					t.Errorf("ferry wrote %v, want %v", got, wantFiles)
				}

				// Tensors.
				ms := want["model.safetensors"]
				var wt []goldenTensor
				for name, r := range ms.Tensors {
					g := goldenTensor{Name: name}
					if json.Unmarshal(r[0], &g.DType) != nil || json.Unmarshal(r[1], &g.Shape) != nil || json.Unmarshal(r[2], &g.SHA256) != nil {
						t.Fatalf("inventory tensor %s: %s", name, r)
					}
					wt = append(wt, g)
				}
				got := dumpDir(t, out, "ferry")
				compareTensors(t, wt, got.Tensors)
				for _, g := range got.Tensors {
					if strings.Contains(g.Name, "visual") || strings.Contains(g.Name, "mtp") {
						t.Errorf("tensor %s: mlx-lm drops it", g.Name)
					}
				}
				f, err := safetensors.Open(filepath.Join(out, "model.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(f.Metadata, ms.Metadata) {
					t.Errorf("model.safetensors metadata %v, want %v", f.Metadata, ms.Metadata)
				}
				f.Close()

				for _, name := range []string{"model.safetensors.index.json", "generation_config.json", "README.md"} {
					if g, w := mustRead(t, filepath.Join(out, name)), mustRead(t, filepath.Join(golden, name)); !bytes.Equal(g, w) {
						t.Errorf("%s differs from mlx-lm's:\n%s\nmlx-lm:\n%s", name, g, w)
					}
				}

				cfg := mustRead(t, filepath.Join(out, "config.json"))
				if g, w := withoutDropRecord(t, cfg), mustRead(t, filepath.Join(golden, "config.json")); !bytes.Equal(g, w) {
					t.Errorf("config.json, less ferry's MTP record, differs from mlx-lm's:\n%s\nmlx-lm:\n%s", g, w)
				}

				sameTokenizer(t, src, out, golden)
			})
		}
	}
}

// withoutDropRecord undoes, in the text, what ferry's config.json records
// on purpose about a dropped MTP head: the ferry_mtp_dropped block (a
// top-level key, four-space indent) and mtp_num_hidden_layers set to 0.
func withoutDropRecord(t *testing.T, cfg []byte) []byte {
	t.Helper()
	lines := strings.Split(string(cfg), "\n")
	var out []string
	skip, found, zeroed := false, false, 0
	for _, l := range lines {
		switch {
		case l == `    "`+MTPRecordKey+`": {`:
			skip, found = true, true
			continue
		case skip:
			if l == "    }," {
				skip = false
			}
			continue
		case strings.TrimSpace(l) == `"mtp_num_hidden_layers": 0,`:
			l = strings.Replace(l, ": 0,", ": 1,", 1)
			zeroed++
		}
		out = append(out, l)
	}
	if !found || zeroed != 1 {
		t.Fatalf("config.json: MTP record found %v, mtp_num_hidden_layers 0 %d times:\n%s", found, zeroed, cfg)
	}
	return []byte(strings.Join(out, "\n"))
}

// sameTokenizer checks that ferry copied src's tokenizer files as they are,
// and that they are the tokenizer mlx-lm's re-save in golden holds.
func sameTokenizer(t *testing.T, src, out, golden string) {
	t.Helper()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if !bytes.Equal(mustRead(t, filepath.Join(out, f)), mustRead(t, filepath.Join(src, f))) {
			t.Errorf("%s is not the source's", f)
		}
	}
	load := func(path string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(mustRead(t, path), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	ft, gt := load(filepath.Join(out, "tokenizer.json")), load(filepath.Join(golden, "tokenizer.json"))
	for _, k := range []string{"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder"} {
		if !reflect.DeepEqual(ft[k], gt[k]) {
			t.Errorf("tokenizer.json %s: %v, mlx-lm's %v", k, ft[k], gt[k])
		}
	}
	fm, gm := ft["model"].(map[string]any), gt["model"].(map[string]any)
	for _, k := range []string{"type", "vocab", "merges", "unk_token", "byte_fallback", "fuse_unk", "ignore_merges", "dropout"} {
		if !reflect.DeepEqual(fm[k], gm[k]) {
			t.Errorf("tokenizer.json model.%s differs from mlx-lm's", k)
		}
	}
	fc, gc := load(filepath.Join(out, "tokenizer_config.json")), load(filepath.Join(golden, "tokenizer_config.json"))
	for _, k := range []string{"bos_token", "eos_token", "pad_token", "unk_token", "tokenizer_class", "model_max_length", "add_prefix_space", "clean_up_tokenization_spaces", "split_special_tokens", "errors"} {
		if !reflect.DeepEqual(fc[k], gc[k]) {
			t.Errorf("tokenizer_config.json %s = %v, mlx-lm's %v", k, fc[k], gc[k])
		}
	}
	if !reflect.DeepEqual(fc["additional_special_tokens"], gc["extra_special_tokens"]) {
		t.Errorf("special tokens %v, mlx-lm's extra_special_tokens %v", fc["additional_special_tokens"], gc["extra_special_tokens"])
	}
	if tmpl := string(mustRead(t, filepath.Join(golden, "chat_template.jinja"))); fc["chat_template"] != tmpl {
		t.Errorf("chat_template %q, mlx-lm's chat_template.jinja %q", fc["chat_template"], tmpl)
	}
}

// TestQwen35VLAsLoaded holds, without MLX, what the device run recorded in
// testdata/qwen35vl_mlx/loaded (PROVENANCE.md there): mlx-lm 0.32.0 loads
// ferry's conversions of the vision-language reference and of the MoE set
// (bf16, 4-bit, 4-bit with the head kept in mtp.safetensors) with no MTP
// parameter, and their logits over 16 tokens are bit for bit those of
// mlx-lm's own conversions (the kept head changes nothing). Each ferry
// directory loaded there was ferry's file for file (its model.safetensors
// rebuilt on the device from its header and mlx-lm's tensors, and checked
// against ferry's sha256); ferry's output for the same source must still
// be exactly that: every file's sha256, config.json up to the wording of
// ferry's own records. A change to any byte mlx-lm reads fails here until
// the run is made again.
func TestQwen35VLAsLoaded(t *testing.T) {
	const dir = "testdata/qwen35vl_mlx/loaded"
	for _, set := range []struct {
		name string
		src  func(t *testing.T) string
	}{
		{"vl", func(*testing.T) string { return qwen35VLBase }},
		{"moe", func(t *testing.T) string { return moeVLBase(t, "moevl", testmodel.Qwen35MoEVLDevice) }},
	} {
		t.Run(set.name, func(t *testing.T) {
			var r deviceRun
			if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "check_"+set.name+".json")), &r); err != nil {
				t.Fatal(err)
			}
			if r.MLXLM != "0.32.0" {
				t.Fatalf("check_%s.json is mlx-lm %s's run", set.name, r.MLXLM)
			}
			for _, a := range []string{"ferry_bf16", "ferry_g64_b4", "ferry_g64_b4_mtp", "mlxlm_bf16", "mlxlm_g64_b4"} {
				if !r.Artifacts[a].Loaded || r.Artifacts[a].MTPParametersLoaded != 0 {
					t.Fatalf("%s: loaded %v, %d MTP parameters", a, r.Artifacts[a].Loaded, r.Artifacts[a].MTPParametersLoaded)
				}
			}
			for _, pair := range []string{"ferry_bf16 vs mlxlm_bf16", "ferry_g64_b4 vs mlxlm_g64_b4", "ferry_g64_b4 vs ferry_g64_b4_mtp"} {
				if !r.Compare[pair].Identical {
					t.Fatalf("%s not identical: %+v", pair, r.Compare[pair])
				}
			}
			src := set.src(t)
			for _, v := range []struct {
				name string
				opts QuantizeOptions
			}{
				{"bf16", QuantizeOptions{}},
				{"g64_b4", QuantizeOptions{Bits: 4, GroupSize: 64}},
				{"g64_b4_mtp", QuantizeOptions{Bits: 4, GroupSize: 64, KeepMTP: true}},
			} {
				out := filepath.Join(t.TempDir(), v.name)
				convertTo(t, src, out, v.opts, QuantizeRunOptions{Jobs: 2})
				rec := r.Artifacts["ferry_"+v.name].Files
				var want []string
				for f := range rec {
					want = append(want, f)
				}
				slices.Sort(want)
				if got := resFiles(t, out); !slices.Equal(got, want) {
					t.Errorf("%s: ferry writes %v, the device run loaded %v", v.name, got, want)
				}
				for f, fr := range rec {
					b := mustRead(t, filepath.Join(out, f))
					if f == "config.json" {
						kept := mustRead(t, filepath.Join(dir, set.name+"_"+v.name, f))
						if sha256hex(kept) != fr.SHA256 {
							t.Fatalf("%s/%s_%s/config.json is not the file the run loaded", dir, set.name, v.name)
						}
						if a, b := withoutReasons(t, b), withoutReasons(t, kept); a != b {
							t.Errorf("%s/config.json differs from the one the device run loaded:\n%s\nloaded:\n%s", v.name, a, b)
						}
						continue
					}
					if got := sha256hex(b); got != fr.SHA256 {
						t.Errorf("%s/%s: sha256 %s, but the device run loaded %s: ferry's output is no longer what mlx-lm was shown to load (testdata/qwen35vl_mlx/PROVENANCE.md: run it again)", v.name, f, got, fr.SHA256)
					}
				}
			}
		})
	}
}
