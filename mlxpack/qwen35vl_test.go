package mlxpack

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// textOnlyEquivalent writes the language model (and mtp.*) of a
// vision-language checkpoint as the text-only checkpoint of the same
// weights (as the reference's make_vl.py textonly_equiv step does):
// model.language_model.* → model.*, model.visual.* left out, lm_head and
// mtp.* as they are, config.json = text_config with the
// Qwen3_5(Moe)ForCausalLM architecture, the other files copied.
func textOnlyEquivalent(t *testing.T, vl, dst string) {
	t.Helper()
	ck, err := safetensors.OpenDir(vl)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var specs []safetensors.TensorSpec
	src := map[string]safetensors.Location{}
	for _, l := range ck.Tensors() {
		n := l.Info.Name
		if strings.HasPrefix(n, "model.visual.") {
			continue
		}
		if rest, ok := strings.CutPrefix(n, "model.language_model."); ok {
			n = "model." + rest
		}
		specs = append(specs, safetensors.TensorSpec{Name: n, DType: l.Info.DType, Shape: l.Info.Shape})
		src[n] = l
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := safetensors.Create(filepath.Join(dst, "model.safetensors"), map[string]string{"format": "pt"}, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		if err := w.WriteTensor(s.Name, src[s.Name].Section()); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	text, _ := ck.Config.Raw["text_config"].(map[string]any)
	arch := "Qwen3_5ForCausalLM"
	if ck.Config.ModelType == "qwen3_5_moe" {
		arch = "Qwen3_5MoeForCausalLM"
	}
	text["architectures"] = []any{arch}
	b, err := json.MarshalIndent(text, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if err := os.WriteFile(filepath.Join(dst, f), mustRead(t, filepath.Join(vl, f)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestQwen35VLAsTextOnly: mlx-lm's qwen3_5 and qwen3_5_moe sanitize treat
// the vision-language wrapper as the text model plus a vision tower they
// drop (model.language_model → language_model.model, model.visual.*
// dropped, the rest under language_model.). So ferry's conversion of a
// Qwen3_5(Moe)ForConditionalGeneration checkpoint — dense, MoE with fused
// experts (what mlx-lm reads), MoE with per-expert tensors (which ferry
// stacks) — must write exactly the tensors, shards and index it writes for
// the text-only checkpoint of the same weights, with the MTP head dropped
// or kept (mtp.safetensors byte for byte the same too), and a config that
// keeps the wrapper (text_config nested, no vision_config) with the same
// MTP record.
func TestQwen35VLAsTextOnly(t *testing.T) {
	type writer func(dir string) error
	sets := map[string]writer{
		"dense": func(dir string) error {
			_, err := testmodel.Qwen35VL(dir, testmodel.Qwen35Options{Common: testmodel.Common{Seed: 9}})
			return err
		},
		"moe-fused": func(dir string) error {
			_, err := testmodel.Qwen35MoEVL(dir, testmodel.Qwen35MoEOptions{Common: testmodel.Common{Seed: 9}, MoE: testmodel.MoE{FusedExperts: true}})
			return err
		},
		"moe-per-expert": func(dir string) error {
			_, err := testmodel.Qwen35MoEVL(dir, testmodel.Qwen35MoEOptions{Common: testmodel.Common{Seed: 9}})
			return err
		},
	}
	for name, write := range sets {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if err := write(filepath.Join(root, "set")); err != nil {
				t.Fatal(err)
			}
			vl := filepath.Join(root, "set", "base")
			text := filepath.Join(root, "text")
			textOnlyEquivalent(t, vl, text)
			for _, opts := range []QuantizeOptions{{}, {Bits: 4, GroupSize: 64}, {Bits: 4, GroupSize: 64, KeepMTP: true}} {
				ov, ot := filepath.Join(t.TempDir(), "vl"), filepath.Join(t.TempDir(), "text")
				rv := convertTo(t, vl, ov, opts, QuantizeRunOptions{Jobs: 2})
				convertTo(t, text, ot, opts, QuantizeRunOptions{Jobs: 2})
				files := resFiles(t, ov)
				if tf := resFiles(t, ot); strings.Join(files, " ") != strings.Join(tf, " ") {
					t.Fatalf("%+v: files %v, text-only %v", opts, files, tf)
				}
				for _, f := range files {
					if f == "config.json" {
						continue
					}
					if !bytes.Equal(mustRead(t, filepath.Join(ov, f)), mustRead(t, filepath.Join(ot, f))) {
						t.Errorf("%+v: %s differs from the text-only checkpoint's", opts, f)
					}
				}
				for _, tn := range rv.Tensors {
					if strings.Contains(tn.Name, "visual") {
						t.Errorf("%+v: %s written", opts, tn.Name)
					}
				}
				var cv, ct map[string]any
				json.Unmarshal(mustRead(t, filepath.Join(ov, "config.json")), &cv)
				json.Unmarshal(mustRead(t, filepath.Join(ot, "config.json")), &ct)
				tc, _ := cv["text_config"].(map[string]any)
				if tc == nil || cv["vision_config"] != nil || !strings.HasSuffix(cv["architectures"].([]any)[0].(string), "ForConditionalGeneration") {
					t.Errorf("%+v: config %v", opts, cv)
				}
				if tc["mtp_num_hidden_layers"] != ct["mtp_num_hidden_layers"] {
					t.Errorf("%+v: mtp_num_hidden_layers %v, text-only %v", opts, tc["mtp_num_hidden_layers"], ct["mtp_num_hidden_layers"])
				}
				for _, k := range []string{MTPRecordKey, MTPSideKey, "quantization", "quantization_config", "eos_token_id"} {
					a, _ := json.Marshal(cv[k])
					b, _ := json.Marshal(ct[k])
					if !bytes.Equal(a, b) {
						t.Errorf("%+v: config %s %s, text-only %s", opts, k, a, b)
					}
				}
			}
		})
	}
}
