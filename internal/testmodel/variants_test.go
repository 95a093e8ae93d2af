package testmodel

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

func shapeOf(t *testing.T, ck *safetensors.Checkpoint, name string) []int64 {
	t.Helper()
	l, ok := ck.Lookup(name)
	if !ok {
		t.Fatalf("tensor %q missing", name)
	}
	return l.Info.Shape
}

func wantShape(t *testing.T, ck *safetensors.Checkpoint, name string, want ...int64) {
	t.Helper()
	if got := shapeOf(t, ck, name); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: shape %v, want %v", name, got, want)
	}
}

func openWritten(t *testing.T, w writer) (*Model, *safetensors.Checkpoint) {
	t.Helper()
	dir := t.TempDir()
	m, err := w.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return m, ck
}

// TestQwen35Shapes checks the hybrid family's tensor shapes and config
// fields against the formulas of the real architecture.
func TestQwen35Shapes(t *testing.T) {
	m, ck := openWritten(t, Qwen35Options{})
	// defaults: H 64, 2 heads × 32, 1 KV head, linear 2×16 key / 4×16 value, K 4.
	wantShape(t, ck, "model.layers.0.linear_attn.in_proj_qkv.weight", 2*32+64, 64)
	wantShape(t, ck, "model.layers.0.linear_attn.in_proj_z.weight", 64, 64)
	wantShape(t, ck, "model.layers.0.linear_attn.in_proj_b.weight", 4, 64)
	wantShape(t, ck, "model.layers.0.linear_attn.in_proj_a.weight", 4, 64)
	wantShape(t, ck, "model.layers.0.linear_attn.conv1d.weight", 128, 1, 4)
	wantShape(t, ck, "model.layers.0.linear_attn.A_log", 4)
	wantShape(t, ck, "model.layers.0.linear_attn.dt_bias", 4)
	wantShape(t, ck, "model.layers.0.linear_attn.norm.weight", 16)
	wantShape(t, ck, "model.layers.0.linear_attn.out_proj.weight", 64, 64)
	wantShape(t, ck, "model.layers.3.self_attn.q_proj.weight", 2*2*32, 64)
	wantShape(t, ck, "model.layers.3.self_attn.k_proj.weight", 32, 64)
	wantShape(t, ck, "model.layers.3.self_attn.o_proj.weight", 64, 64)
	wantShape(t, ck, "mtp.fc.weight", 64, 128)
	wantShape(t, ck, "mtp.layers.0.self_attn.q_proj.weight", 128, 64)
	cfg := ck.Config
	if lt, _ := cfg.Get("layer_types"); !reflect.DeepEqual(lt, []any{"linear_attention", "linear_attention", "linear_attention", "full_attention"}) {
		t.Errorf("layer_types %v", lt)
	}
	if n, _ := cfg.Int("full_attention_interval"); n != 4 {
		t.Errorf("full_attention_interval %d", n)
	}
	rp, _ := cfg.Get("rope_parameters")
	if sec := rp.(map[string]any)["mrope_section"]; len(sec.([]any)) != 3 {
		t.Errorf("mrope_section %v", sec)
	}
	if f, _ := cfg.Float("partial_rotary_factor"); f != 0.25 {
		t.Errorf("partial_rotary_factor %v", f)
	}
	if mt, _ := cfg.String("model_type"); mt != "qwen3_5_text" || m.ModelType != "qwen3_5_text" {
		t.Errorf("model_type %q", mt)
	}
	if got := mropeSection(128, 0.25); !reflect.DeepEqual(got, []int{6, 5, 5}) {
		t.Errorf("mrope for head_dim 128: %v", got)
	}
	if got := mropeSection(256, 0.25); !reflect.DeepEqual(got, []int{11, 11, 10}) {
		t.Errorf("mrope for head_dim 256: %v", got)
	}
}

func TestQwen35Variants(t *testing.T) {
	t.Run("omit-mtp-tensors", func(t *testing.T) {
		m, ck := openWritten(t, Qwen35Options{Hybrid: Hybrid{OmitMTPTensors: true}})
		if ck.Config.MTPLayers() != 1 || len(m.MTPNames()) != 0 {
			t.Errorf("config MTP %d, tensors %v", ck.Config.MTPLayers(), m.MTPNames())
		}
		for _, l := range ck.Tensors() {
			if strings.HasPrefix(l.Info.Name, "mtp.") {
				t.Errorf("stray %s", l.Info.Name)
			}
		}
	})
	t.Run("no-mtp", func(t *testing.T) {
		_, ck := openWritten(t, Qwen35Options{Hybrid: Hybrid{NoMTP: true}})
		if _, ok := ck.Config.Get("mtp_num_hidden_layers"); ok {
			t.Error("mtp_num_hidden_layers written")
		}
	})
	t.Run("conditional-generation", func(t *testing.T) {
		m, ck := openWritten(t, Qwen35Options{ConditionalGeneration: true})
		if ck.Config.ModelType != "qwen3_5" {
			t.Errorf("model_type %q", ck.Config.ModelType)
		}
		tc, ok := ck.Config.Raw["text_config"].(map[string]any)
		if !ok || tc["model_type"] != "qwen3_5_text" || tc["mtp_num_hidden_layers"] == nil {
			t.Fatalf("text_config %v", tc)
		}
		for _, tt := range m.Tensors {
			if !strings.HasPrefix(tt.Name, "model.language_model.") && !strings.HasPrefix(tt.Name, "mtp.") && tt.Name != "lm_head.weight" {
				t.Errorf("tensor %s outside model.language_model.", tt.Name)
			}
		}
		wantShape(t, ck, "model.language_model.layers.3.self_attn.q_proj.weight", 128, 64)
	})
	t.Run("custom-layer-types", func(t *testing.T) {
		m, ck := openWritten(t, Qwen35Options{Common: Common{NumLayers: 3}, Hybrid: Hybrid{LayerTypes: []string{"full_attention", "linear_attention", "full_attention"}}})
		if _, ok := ck.Lookup("model.layers.2.self_attn.q_proj.weight"); !ok || len(m.LayerTypes) != 3 {
			t.Error("layer 2 is not full attention")
		}
		if _, ok := ck.Lookup("model.layers.1.linear_attn.A_log"); !ok {
			t.Error("layer 1 is not linear attention")
		}
	})
	t.Run("bad-layer-types", func(t *testing.T) {
		if _, err := (Qwen35Options{Hybrid: Hybrid{LayerTypes: []string{"full_attention"}}}).Write(t.TempDir()); err == nil {
			t.Error("1 layer type for 4 layers accepted")
		}
	})
}

func TestMoEShapes(t *testing.T) {
	t.Run("qwen35moe", func(t *testing.T) {
		m, ck := openWritten(t, Qwen35MoEOptions{})
		if m.ModelType != "qwen3_5_moe_text" {
			t.Errorf("model_type %q", m.ModelType)
		}
		for _, p := range []string{"model.layers.0.", "model.layers.3.", "mtp.layers.0."} {
			wantShape(t, ck, p+"mlp.gate.weight", 4, 64)
			wantShape(t, ck, p+"mlp.experts.3.gate_proj.weight", 32, 64)
			wantShape(t, ck, p+"mlp.experts.3.up_proj.weight", 32, 64)
			wantShape(t, ck, p+"mlp.experts.3.down_proj.weight", 64, 32)
			wantShape(t, ck, p+"mlp.shared_expert.gate_proj.weight", 32, 64)
			wantShape(t, ck, p+"mlp.shared_expert.down_proj.weight", 64, 32)
			wantShape(t, ck, p+"mlp.shared_expert_gate.weight", 1, 64)
		}
		if _, ok := ck.Lookup("model.layers.0.mlp.gate_proj.weight"); ok {
			t.Error("dense MLP in an MoE model")
		}
		for _, k := range []string{"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"} {
			if _, ok := ck.Config.Int(k); !ok {
				t.Errorf("config lacks %s", k)
			}
		}
	})
	t.Run("fused", func(t *testing.T) {
		_, ck := openWritten(t, Qwen35MoEOptions{MoE: MoE{FusedExperts: true}})
		wantShape(t, ck, "model.layers.0.mlp.experts.gate_up_proj", 4, 64, 64)
		wantShape(t, ck, "model.layers.0.mlp.experts.down_proj", 4, 64, 32)
		wantShape(t, ck, "mtp.layers.0.mlp.experts.0.gate_proj.weight", 32, 64)
	})
	t.Run("qwen3next", func(t *testing.T) {
		m, ck := openWritten(t, Qwen3NextOptions{})
		if m.ModelType != "qwen3_next" {
			t.Errorf("model_type %q", m.ModelType)
		}
		wantShape(t, ck, "model.layers.0.linear_attn.in_proj_qkvz.weight", 2*32+2*64, 64)
		wantShape(t, ck, "model.layers.0.linear_attn.in_proj_ba.weight", 8, 64)
		if _, ok := ck.Lookup("model.layers.0.linear_attn.in_proj_qkv.weight"); ok {
			t.Error("unfused in_proj_qkv in Qwen3-Next")
		}
		rp, _ := ck.Config.Get("rope_parameters")
		if _, ok := rp.(map[string]any)["mrope_section"]; ok {
			t.Error("mrope_section in Qwen3-Next")
		}
	})
}

func TestDeepSeekNextN(t *testing.T) {
	m, ck := openWritten(t, DeepSeekV3Options{})
	if n, _ := ck.Config.Int("num_nextn_predict_layers"); n != 1 || m.MTPLayers != 1 {
		t.Errorf("num_nextn_predict_layers %d", n)
	}
	p := "model.layers.2." // num_hidden_layers = 2
	wantShape(t, ck, p+"embed_tokens.weight", 512, 64)
	wantShape(t, ck, p+"enorm.weight", 64)
	wantShape(t, ck, p+"hnorm.weight", 64)
	wantShape(t, ck, p+"eh_proj.weight", 64, 128)
	wantShape(t, ck, p+"shared_head.norm.weight", 64)
	wantShape(t, ck, p+"shared_head.head.weight", 512, 64)
	wantShape(t, ck, p+"self_attn.kv_a_proj_with_mqa.weight", 16+8, 64)
	wantShape(t, ck, p+"mlp.experts.0.down_proj.weight", 64, 32)
	wantShape(t, ck, "model.layers.0.mlp.gate_proj.weight", 128, 64)
	wantShape(t, ck, "model.layers.1.mlp.gate.weight", 4, 64)
	for _, n := range m.MTPNames() {
		if !strings.HasPrefix(n, p) {
			t.Errorf("MTP tensor %s", n)
		}
	}
	_, ck2 := openWritten(t, DeepSeekV3Options{NoNextN: true})
	if _, ok := ck2.Lookup(p + "eh_proj.weight"); ok || ck2.Config.MTPLayers() != 0 {
		t.Error("NoNextN still writes a NextN layer")
	}
}

func TestDenseShapes(t *testing.T) {
	_, ck := openWritten(t, Qwen2Options{})
	wantShape(t, ck, "model.layers.0.self_attn.q_proj.bias", 64)
	wantShape(t, ck, "model.layers.0.self_attn.k_proj.bias", 32)
	if _, ok := ck.Config.Get("head_dim"); ok {
		t.Error("qwen2 config has head_dim")
	}
	_, ck = openWritten(t, Qwen3Options{Common{TieWordEmbeddings: true}})
	if _, ok := ck.Lookup("lm_head.weight"); ok {
		t.Error("tied model has lm_head.weight")
	}
	wantShape(t, ck, "model.layers.1.self_attn.q_norm.weight", 16)
	_, ck = openWritten(t, LlamaOptions{Common{NumHeads: 8, NumKVHeads: 2, HeadDim: 8}})
	wantShape(t, ck, "model.layers.0.self_attn.k_proj.weight", 16, 64)
	if _, err := (Qwen2Options{Common{HeadDim: 7}}).Write(t.TempDir()); err == nil {
		t.Error("qwen2 with head_dim != hidden/heads accepted")
	}
	if _, err := (LlamaOptions{Common{DType: "I8"}}).Write(t.TempDir()); err == nil {
		t.Error("I8 accepted")
	}
}

func TestDTypeOverrides(t *testing.T) {
	m, ck := openWritten(t, Qwen35Options{Common: Common{DTypeOverrides: map[string]tensor.DType{"A_log": tensor.F32, "mlp.down_proj.weight": tensor.F16}}})
	for _, tt := range m.Tensors {
		want := tensor.BF16
		switch {
		case strings.HasSuffix(tt.Name, "A_log"):
			want = tensor.F32
		case strings.HasSuffix(tt.Name, "mlp.down_proj.weight"):
			want = tensor.F16
		}
		l, _ := ck.Lookup(tt.Name)
		if tt.DType != want || l.Info.DType != want {
			t.Errorf("%s: model %s, file %s, want %s", tt.Name, tt.DType, l.Info.DType, want)
		}
	}
	if _, err := (Qwen35Options{Common: Common{DTypeOverrides: map[string]tensor.DType{"A_log": tensor.I8}}}).Write(t.TempDir()); err == nil {
		t.Error("I8 override accepted")
	}
}
