package testmodel

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// The reference vision-language checkpoint, copied verbatim into the
// repository (testdata/models/qwen35vl-tiny/PROVENANCE.md).
const qwen35VLReference = "../../testdata/models/qwen35vl-tiny/base"

// TestQwen35VLMatchesReference: with the reference's dimensions the
// generated vision-language checkpoint has the reference's layout exactly
// (values aside: they come from another generator): every tensor's name,
// dtype, shape and shard, the index's tensor list, config.json and the
// tokenizer as JSON values, and preprocessor_config.json byte for byte.
func TestQwen35VLMatchesReference(t *testing.T) {
	o := Qwen35Reference()
	o.VocabSize, o.IntermediateSize = 520, 256
	o.Vision = &Vision{}
	dir := t.TempDir()
	m, err := o.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := safetensors.OpenDir(qwen35VLReference)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	got, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	layout := func(ck *safetensors.Checkpoint) map[string]string {
		out := map[string]string{}
		for _, l := range ck.Tensors() {
			out[l.Info.Name] = fmt.Sprint(l.Info.DType, l.Info.Shape, " ", l.Shard.Name)
		}
		return out
	}
	rl, gl := layout(ref), layout(got)
	for n, w := range rl {
		if gl[n] != w {
			t.Errorf("%s: %q, the reference's %q", n, gl[n], w)
		}
	}
	for n := range gl {
		if _, ok := rl[n]; !ok {
			t.Errorf("extra tensor %s", n)
		}
	}
	var visual int
	for _, n := range m.Names() {
		if strings.HasPrefix(n, "model.visual.") {
			visual++
		}
	}
	if visual != 33 || len(m.MTPNames()) != 15 {
		t.Errorf("%d model.visual.* and %d mtp.* tensors, want 33 and 15", visual, len(m.MTPNames()))
	}
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if g, w := readJSONFile(t, filepath.Join(dir, f)), readJSONFile(t, filepath.Join(qwen35VLReference, f)); !reflect.DeepEqual(g, w) {
			t.Errorf("%s differs from the reference's:\n%v\n%v", f, g, w)
		}
	}
	pg, _ := os.ReadFile(filepath.Join(dir, "preprocessor_config.json"))
	pw, _ := os.ReadFile(filepath.Join(qwen35VLReference, "preprocessor_config.json"))
	if !bytes.Equal(pg, pw) {
		t.Errorf("preprocessor_config.json:\n%s\nthe reference's:\n%s", pg, pw)
	}
	want, _ := filepath.Glob(filepath.Join(qwen35VLReference, "*"))
	var wantFiles []string
	for _, f := range want {
		wantFiles = append(wantFiles, filepath.Base(f))
	}
	if !slices.Equal(m.Files, wantFiles) {
		t.Errorf("files %v, the reference's %v", m.Files, wantFiles)
	}
}

// TestQwen35MoEVL writes the MoE set: the wrapper's names and config, the
// vision tower, fused experts, and a DoRA adapter whose keys are the
// language model's (attention, linear attention, shared expert; no routed
// expert, router, vision or MTP module).
func TestQwen35MoEVL(t *testing.T) {
	set, err := Qwen35MoEVL(t.TempDir(), Qwen35MoEOptions{Common: Common{Seed: 5}, MoE: MoE{FusedExperts: true}})
	if err != nil {
		t.Fatal(err)
	}
	m := set.Base
	if m.Architecture != "Qwen3_5MoeForConditionalGeneration" || m.Config["model_type"] != "qwen3_5_moe" || m.ModelType != "qwen3_5_moe_text" {
		t.Errorf("architecture %s, model_type %v / %s", m.Architecture, m.Config["model_type"], m.ModelType)
	}
	vc, _ := m.Config["vision_config"].(map[string]any)
	if vc["model_type"] != "qwen3_5_moe_vision" || vc["out_hidden_size"] != 64 {
		t.Errorf("vision_config %v", vc)
	}
	if m.Config["image_token_id"] != 512-8+3 || m.TextConfig["eos_token_id"] != 512-8-1 {
		t.Errorf("image_token_id %v, eos %v", m.Config["image_token_id"], m.TextConfig["eos_token_id"])
	}
	for _, n := range []string{"model.visual.merger.linear_fc2.weight", "model.language_model.layers.0.mlp.experts.gate_up_proj", "lm_head.weight", "mtp.layers.0.mlp.experts.3.down_proj.weight"} {
		if _, ok := m.Lookup(n); !ok {
			t.Errorf("no %s", n)
		}
	}
	for _, f := range []string{"preprocessor_config.json", "tokenizer.json", "tokenizer_config.json"} {
		if !slices.Contains(m.Files, f) {
			t.Errorf("no %s", f)
		}
	}
	if len(set.Adapter.Modules) == 0 {
		t.Fatal("adapter adapts nothing")
	}
	kinds := map[string]bool{}
	for _, am := range set.Adapter.Modules {
		if !strings.HasPrefix(am.Module, "model.language_model.layers.") || strings.Contains(am.Module, "experts.") || strings.HasSuffix(am.Module, "mlp.gate") {
			t.Errorf("adapted module %s", am.Module)
		}
		if !strings.HasPrefix(am.A, "base_model.model.model.language_model.layers.") || am.Magnitude == "" {
			t.Errorf("%s: keys %s, magnitude %q", am.Module, am.A, am.Magnitude)
		}
		kinds[am.Module[strings.LastIndexByte(am.Module, '.')+1:]] = true
	}
	for _, k := range []string{"q_proj", "in_proj_qkv", "out_proj", "gate_proj", "down_proj"} {
		if !kinds[k] {
			t.Errorf("no %s adapted (%v)", k, kinds)
		}
	}
	if _, err := os.Stat(filepath.Join(set.AdapterDir, "adapter_model.safetensors")); err != nil {
		t.Error(err)
	}
}
