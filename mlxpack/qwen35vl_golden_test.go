package mlxpack

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

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

// TestQwen35VLGolden converts the vision-language reference as mlx-lm
// 0.32.0's convert did (testdata/qwen35vl_mlx/PROVENANCE.md: bf16, and -q
// group 64 bits 4) and holds ferry's output to every file of that golden:
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
//     quantization block twice;
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
	const gdir = "testdata/qwen35vl_mlx"
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
		t.Run(c.name, func(t *testing.T) {
			want := inv["qwen35vl_"+c.name]
			if len(want) == 0 {
				t.Fatalf("inventory has no qwen35vl_%s", c.name)
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
			out := filepath.Join(t.TempDir(), "mlx")
			convertTo(t, qwen35VLBase, out, c.opts, QuantizeRunOptions{Jobs: 2})

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

			sameTokenizer(t, qwen35VLBase, out, golden)
		})
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
