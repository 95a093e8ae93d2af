package family

import (
	"slices"
	"strings"
	"testing"
)

// TestBuiltin: every builtin family is found by each of its names, and the
// lookups answer what the format packages ask.
func TestBuiltin(t *testing.T) {
	for _, f := range builtin {
		for _, l := range f.Layouts {
			g, lay, ok := ByArchitecture(l.Architecture)
			if !ok || g != f || lay.Architecture != l.Architecture {
				t.Errorf("ByArchitecture(%s) = %v, %v, want family %s", l.Architecture, g, ok, f.Name)
			}
		}
		for _, mt := range f.ModelTypes {
			if g, ok := ByModelType(mt); !ok || g != f {
				t.Errorf("ByModelType(%s) = %v, want family %s", mt, g, f.Name)
			}
		}
		if f.GGUF != nil {
			if g, ok := ByGGUFArch(f.GGUF.Arch); !ok || g != f {
				t.Errorf("ByGGUFArch(%s) = %v, want family %s", f.GGUF.Arch, g, f.Name)
			}
		}
	}
	for _, tt := range []struct{ arch, modelType, text, want string }{
		{"Qwen3_5ForConditionalGeneration", "qwen3_5", "qwen3_5_text", "qwen35"},
		{"", "qwen3_5_moe_text", "", "qwen35moe"},
		{"SomethingElse", "", "qwen3_5_text", "qwen35"},
		{"Qwen3NextForCausalLM", "qwen3_next", "", "qwen3next"},
	} {
		f, ok := ByConfig(tt.arch, tt.modelType, tt.text)
		if !ok || f.Name != tt.want {
			t.Errorf("ByConfig(%q, %q, %q) = %v, %v, want %s", tt.arch, tt.modelType, tt.text, f, ok, tt.want)
		}
	}
	if _, ok := ByConfig("MistralForCausalLM", "mistral", ""); ok {
		t.Error("mistral has no descriptor of its own (mlx-lm loads it as llama)")
	}
	for _, tt := range []struct{ mt, want string }{{"qwen3_5_text", "qwen35"}, {"mistral", "llama"}, {"kimi_k25", "deepseekv3"}, {"qwen3_moe", "qwen3moe"}} {
		if f, ok := ByMLXModelType(tt.mt); !ok || f.Name != tt.want {
			t.Errorf("ByMLXModelType(%s) = %v, want %s", tt.mt, f, tt.want)
		}
	}
	// Qwen3.5's two layouts: text-only and vision-language.
	_, vl, _ := ByArchitecture("Qwen3_5MoeForConditionalGeneration")
	if !vl.Vision || !vl.TextConfig || vl.Trunk != HFLanguageModel || vl.VisionTower != HFVisual {
		t.Errorf("Qwen3_5MoeForConditionalGeneration layout %+v", vl)
	}
	_, text, _ := ByArchitecture("Qwen3_5ForCausalLM")
	if text.Vision || text.TextConfig || text.Trunk != HFTrunk {
		t.Errorf("Qwen3_5ForCausalLM layout %+v", text)
	}
	for _, tt := range []struct {
		arch string
		want QuantRules
	}{
		{"llama", QuantRules{Blocks70B: 80, Llama70B: true}}, {"qwen2", QuantRules{Blocks70B: 80}},
		{"jais2", QuantRules{Blocks70B: 68}}, {"falcon", QuantRules{Falcon: true}}, {"clip", QuantRules{NoHParams: true}}, {"qwen35", QuantRules{}}, {"nonesuch", QuantRules{}},
	} {
		if got := QuantRulesOf(tt.arch); got != tt.want {
			t.Errorf("QuantRulesOf(%s) = %+v, want %+v", tt.arch, got, tt.want)
		}
	}
	if got := MLXModelTypes(func(m *MLX) bool { return m.StacksExperts }); !slices.Equal(got, []string{"qwen3_5_moe", "qwen3_5_moe_text", "qwen3_moe"}) {
		t.Errorf("MLX types stacking experts: %v", got)
	}
}

// TestPrefixes: where the builtin families keep decoder layers and MTP
// heads, in every layout, in the order verify looks (what verify held as
// its own lists before the descriptors).
func TestPrefixes(t *testing.T) {
	if got, want := TrunkPrefixes(), []string{"model.language_model.", "language_model.model.", "model.", ""}; !slices.Equal(got, want) {
		t.Errorf("TrunkPrefixes() = %q, want %q", got, want)
	}
	if got, want := MTPPrefixes(), []string{"mtp.", "model.mtp.", "language_model.mtp.", "model.language_model.mtp.", "language_model.model.mtp."}; !slices.Equal(got, want) {
		t.Errorf("MTPPrefixes() = %q, want %q", got, want)
	}
	if got := VisionTowers(); !slices.Equal(got, []string{"model.visual."}) {
		t.Errorf("VisionTowers() = %q", got)
	}
	// A family with a layout of its own is found there too.
	remove, err := Register(&Family{Name: "x", Layouts: []Layout{{Architecture: "XForConditionalGeneration", Trunk: "model.text_model.", Vision: true, VisionTower: "model.vision."}},
		MTP: MTP{Convention: QwenMTP, Prefix: "mtp.", CountKey: "mtp_num_hidden_layers"}})
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	if got := TrunkPrefixes(); !slices.Contains(got, "model.text_model.") || got[len(got)-1] != "" {
		t.Errorf("TrunkPrefixes() = %q, want model.text_model. among them", got)
	}
	if got := VisionTowers(); !slices.Equal(got, []string{"model.visual.", "model.vision."}) {
		t.Errorf("VisionTowers() = %q, want model.vision. after model.visual.", got)
	}
	if got := MTPPrefixes(); !slices.Contains(got, "model.text_model.mtp.") {
		t.Errorf("MTPPrefixes() = %q, want model.text_model.mtp. among them", got)
	}
}

// TestRegister: a family is refused when it is incomplete or claims a
// name another family has, and is found once registered and not after it
// is removed.
func TestRegister(t *testing.T) {
	ok := &Family{Name: "testfam", Layouts: []Layout{{Architecture: "TestFamForCausalLM", Trunk: HFTrunk}}, ModelTypes: []string{"testfam"},
		GGUF: &GGUF{Arch: "testfam", Class: "Qwen3Model", PostAttentionNorm: "ffn_norm"}}
	for _, tt := range []struct {
		name string
		f    *Family
		want string
	}{
		{"no name", &Family{}, "needs a name"},
		{"nothing to find it by", &Family{Name: "x"}, "nothing could find it"},
		{"layout without trunk", &Family{Name: "x", Layouts: []Layout{{Architecture: "X"}}}, "trunk prefix"},
		{"vision without tower", &Family{Name: "x", Layouts: []Layout{{Architecture: "X", Trunk: HFTrunk, Vision: true}}}, "vision tower"},
		{"qwen-mtp without key", &Family{Name: "x", Layouts: []Layout{{Architecture: "X", Trunk: HFTrunk}}, MTP: MTP{Convention: QwenMTP, Prefix: "mtp."}}, "count key"},
		{"writer without post-attention norm", &Family{Name: "x", GGUF: &GGUF{Arch: "x", Class: "Qwen3Model"}}, "post_attention_layernorm"},
		{"mlx quantize without layer order", &Family{Name: "x", Layouts: []Layout{{Architecture: "X", Trunk: HFTrunk}}, MLX: &MLX{ModelType: "x", Sanitize: "simple"}}, "layer order"},
		{"name taken", &Family{Name: "qwen3", Layouts: []Layout{{Architecture: "X", Trunk: HFTrunk}}}, "family name qwen3 is family qwen3's"},
		{"architecture taken", &Family{Name: "x", Layouts: []Layout{{Architecture: "Qwen3ForCausalLM", Trunk: HFTrunk}}}, "architectures[0] Qwen3ForCausalLM is family qwen3's"},
		{"GGUF arch taken", &Family{Name: "x", GGUF: &GGUF{Arch: "falcon"}}, "GGUF arch falcon is family falcon's"},
		{"mlx type taken", &Family{Name: "x", Layouts: []Layout{{Architecture: "X", Trunk: HFTrunk}}, MLX: &MLX{ModelType: "mistral"}}, "mlx-lm model type mistral is family llama's"},
	} {
		if _, err := Register(tt.f); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Register: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	if _, _, found := ByArchitecture("TestFamForCausalLM"); found {
		t.Fatal("found before it is registered")
	}
	remove, err := Register(ok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Register(ok); err == nil {
		t.Error("registered twice")
	}
	if f, _, found := ByArchitecture("TestFamForCausalLM"); !found || f != ok {
		t.Error("not found once registered")
	}
	if f, found := ByGGUFArch("testfam"); !found || f != ok {
		t.Error("GGUF arch not found once registered")
	}
	remove()
	if _, _, found := ByArchitecture("TestFamForCausalLM"); found {
		t.Error("found after it is removed")
	}
}
