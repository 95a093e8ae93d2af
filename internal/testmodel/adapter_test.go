package testmodel

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// TestAdapterReference: adapters made with the reference's options on the
// reference-sized bases have byte-identical adapter_config.json, the same
// tensor keys, dtypes and shapes, and the same file size as the peft 0.21
// adapters in ../shared/reference/*/adapters (copied into testdata/).
func TestAdapterReference(t *testing.T) {
	for _, tc := range []struct {
		name    string
		base    writer
		baseRel string
		opt     AdapterOptions
		modules int
	}{
		{"qwen35_dora", Qwen35Reference(), "qwen35/base", AdapterOptions{R: 8, Alpha: 16, DoRA: true, TargetModules: []string{
			"k_proj", "down_proj", "v_proj", "in_proj_a", "o_proj", "up_proj", "gate_proj",
			"out_proj", "in_proj_z", "in_proj_qkv", "q_proj", "in_proj_b"}}, 31},
		{"qwen3_dora", Qwen3Reference(), "qwen3/base", AdapterOptions{R: 8, Alpha: 16, DoRA: true, TargetModules: []string{
			"k_proj", "down_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "q_proj"}}, 14},
		{"qwen3_rslora", Qwen3Reference(), "qwen3/base", AdapterOptions{R: 4, Alpha: 8, RSLoRA: true, TargetModules: []string{
			"down_proj", "q_proj", "v_proj"}}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			m, err := tc.base.Write(filepath.Join(root, "base"))
			if err != nil {
				t.Fatal(err)
			}
			opt := tc.opt
			opt.BaseModelNameOrPath = tc.baseRel
			a, err := opt.Write(filepath.Join(root, "adapter"), m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, "adapter", "adapter_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile("testdata/" + tc.name + "_adapter_config.json")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Errorf("adapter_config.json differs from peft's:\n%s\n---\n%s", got, want)
			}
			wantRows, meta := readGolden(t, "testdata/"+tc.name+"_adapter_tensors.txt")
			path := filepath.Join(root, "adapter", "adapter_model.safetensors")
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("file size: %d", st.Size()); !strings.Contains(meta, want) {
				t.Errorf("adapter file is %d bytes; reference: %s", st.Size(), meta)
			}
			f, err := safetensors.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var rows []string
			for _, ti := range f.Tensors {
				rows = append(rows, fmt.Sprintf("%s %s %s", ti.Name, ti.DType, shapeString(ti.Shape)))
			}
			sort.Strings(rows)
			if !reflect.DeepEqual(rows, wantRows) {
				t.Errorf("adapter tensors differ from peft's\n got %v\nwant %v", rows, wantRows)
			}
			if len(a.Modules) != tc.modules {
				t.Errorf("%d modules, want %d", len(a.Modules), tc.modules)
			}
		})
	}
}

func readAdapterTensor(t *testing.T, f *safetensors.File, key string) ([]float32, safetensors.TensorInfo) {
	t.Helper()
	ti, ok := f.Tensor(key)
	if !ok {
		t.Fatalf("adapter file lacks %q", key)
	}
	raw, err := io.ReadAll(f.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, ti.NumElements())
	if err := tensor.ToF32(ti.DType, v, raw); err != nil {
		t.Fatal(err)
	}
	return v, ti
}

func TestAdapterOptions(t *testing.T) {
	root := t.TempDir()
	qwen3, err := Qwen3Options{Common{Seed: 5}}.Write(filepath.Join(root, "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	qwen2, err := Qwen2Options{}.Write(filepath.Join(root, "qwen2"))
	if err != nil {
		t.Fatal(err)
	}
	qwen35, err := Qwen35Options{}.Write(filepath.Join(root, "qwen35"))
	if err != nil {
		t.Fatal(err)
	}
	repeated, err := LlamaOptions{Common{RepeatBlock: 1000, Seed: 8}}.Write(filepath.Join(root, "repeated"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		base    *Model
		opt     AdapterOptions
		modules []string // expected module paths (sorted)
		check   func(t *testing.T, a *Adapter, cfg map[string]any)
		wantErr string
	}{
		{name: "lora-qv", base: qwen3, opt: AdapterOptions{R: 4, Alpha: 8},
			modules: []string{"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				m, _ := a.Module("model.layers.0.self_attn.q_proj")
				if m.Scale != 2 || m.In != 64 || m.Out != 64 || m.Magnitude != "" {
					t.Errorf("module %+v", m)
				}
			}},
		{name: "rslora", base: qwen3, opt: AdapterOptions{R: 16, Alpha: 8, RSLoRA: true, TargetModules: []string{"down_proj"}},
			modules: []string{"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				m := a.Modules[0]
				if m.Scale != 2 || m.In != 128 || m.Out != 64 || cfg["use_rslora"] != true {
					t.Errorf("module %+v", m)
				}
			}},
		{name: "patterns", base: qwen3, opt: AdapterOptions{R: 8, Alpha: 16, TargetModules: []string{"q_proj", "k_proj"},
			RankPattern: map[string]int{`layers\.1\.self_attn\.q_proj`: 2}, AlphaPattern: map[string]float64{"k_proj": 5}},
			modules: []string{"model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.q_proj"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				q1, _ := a.Module("model.layers.1.self_attn.q_proj")
				k0, _ := a.Module("model.layers.0.self_attn.k_proj")
				q0, _ := a.Module("model.layers.0.self_attn.q_proj")
				if q1.R != 2 || q1.Scale != 8 || k0.R != 8 || k0.Scale != 5.0/8 || q0.R != 8 || q0.Scale != 2 {
					t.Errorf("q1 %+v k0 %+v q0 %+v", q1, k0, q0)
				}
				if ti, _ := a.Lookup(q1.A); ti.Shape[0] != 2 {
					t.Errorf("rank-pattern A shape %v", ti.Shape)
				}
				rp := cfg["rank_pattern"].(map[string]any)
				if len(rp) != 1 || cfg["alpha_pattern"].(map[string]any)["k_proj"] != json.Number("5") {
					t.Errorf("patterns in config: %v %v", cfg["rank_pattern"], cfg["alpha_pattern"])
				}
			}},
		{name: "regex", base: qwen3, opt: AdapterOptions{TargetRegex: `.*\.1\.mlp\.(gate|up)_proj`},
			modules: []string{"model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				if cfg["target_modules"] != `.*\.1\.mlp\.(gate|up)_proj` {
					t.Errorf("target_modules %v", cfg["target_modules"])
				}
			}},
		{name: "layers-to-transform", base: qwen35, opt: AdapterOptions{TargetModules: []string{"in_proj_qkv", "q_proj"}, LayersToTransform: []int{1, 3}},
			modules: []string{"model.layers.1.linear_attn.in_proj_qkv", "model.layers.3.self_attn.q_proj"}},
		{name: "layers-pattern", base: qwen35, opt: AdapterOptions{TargetModules: []string{"up_proj"}, LayersToTransform: []int{0}, LayersPattern: "layers"},
			modules: []string{"model.layers.0.mlp.up_proj"}},
		{name: "all-linear", base: qwen3, opt: AdapterOptions{AllLinear: true},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				if len(a.Modules) != 14 || cfg["target_modules"] != "all-linear" {
					t.Errorf("%d modules, target %v", len(a.Modules), cfg["target_modules"])
				}
			}},
		{name: "fan-in-fan-out-dora", base: qwen3, opt: AdapterOptions{DoRA: true, FanInFanOut: true, TargetModules: []string{"down_proj"}},
			modules: []string{"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				m := a.Modules[0] // stored [64, 128] read as [in, out]
				if m.In != 64 || m.Out != 128 {
					t.Errorf("module %+v", m)
				}
				checkMagnitude(t, qwen3, a, m, true)
			}},
		{name: "dora-magnitude", base: qwen35, opt: AdapterOptions{DoRA: true, TargetModules: []string{"in_proj_b", "o_proj"}},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				for _, m := range a.Modules {
					if !strings.HasSuffix(m.Magnitude, ".lora_magnitude_vector") {
						t.Errorf("magnitude key %q", m.Magnitude)
					}
					checkMagnitude(t, qwen35, a, m, false)
				}
			}},
		{name: "dora-repeat-block-base", base: repeated, opt: AdapterOptions{DoRA: true, TargetModules: []string{"up_proj", "embed_tokens"}},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				for _, m := range a.Modules {
					checkMagnitude(t, repeated, a, m, m.Embedding)
				}
			}},
		{name: "magnitude-weight-suffix", base: qwen3, opt: AdapterOptions{DoRA: true, MagnitudeWeightSuffix: true},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				if !strings.HasSuffix(a.Modules[0].Magnitude, ".lora_magnitude_vector.weight") {
					t.Errorf("magnitude key %q", a.Modules[0].Magnitude)
				}
			}},
		{name: "embedding-dora", base: qwen3, opt: AdapterOptions{R: 4, DoRA: true, TargetModules: []string{"embed_tokens"}, SaveEmbeddingLayers: true},
			modules: []string{"model.embed_tokens"},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				m := a.Modules[0]
				ta, _ := a.Lookup(m.A)
				tb, _ := a.Lookup(m.B)
				if !m.Embedding || m.A != "base_model.model.model.embed_tokens.lora_embedding_A" ||
					!reflect.DeepEqual(ta.Shape, []int64{4, 512}) || !reflect.DeepEqual(tb.Shape, []int64{64, 4}) {
					t.Errorf("embedding module %+v A %v B %v", m, ta.Shape, tb.Shape)
				}
				checkMagnitude(t, qwen3, a, m, true)
				bl, err := a.Values("base_model.model.model.embed_tokens.base_layer.weight")
				want, _ := qwen3.Values("model.embed_tokens.weight")
				if err != nil || !reflect.DeepEqual(bl, want) {
					t.Errorf("base_layer copy differs: %v", err)
				}
			}},
		{name: "modules-to-save", base: qwen3, opt: AdapterOptions{ModulesToSave: []string{"lm_head"}},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				ti, ok := a.Lookup("base_model.model.lm_head.weight")
				if !ok || ti.DType != tensor.BF16 {
					t.Fatalf("modules_to_save tensor %+v", ti)
				}
				if !reflect.DeepEqual(cfg["modules_to_save"], []any{"lm_head"}) {
					t.Errorf("config modules_to_save %v", cfg["modules_to_save"])
				}
			}},
		{name: "lora-bias", base: qwen2, opt: AdapterOptions{LoRABias: true, TargetModules: []string{"q_proj"}},
			check: func(t *testing.T, a *Adapter, cfg map[string]any) {
				ti, ok := a.Lookup("base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias")
				if !ok || !reflect.DeepEqual(ti.Shape, []int64{64}) || cfg["lora_bias"] != true {
					t.Errorf("lora_B.bias %+v", ti)
				}
			}},
		{name: "lora-bias-no-base-bias", base: qwen3, opt: AdapterOptions{LoRABias: true}, wantErr: "has no bias"},
		{name: "lora-bias-dora", base: qwen2, opt: AdapterOptions{LoRABias: true, DoRA: true}, wantErr: "DoRA"},
		{name: "no-match", base: qwen3, opt: AdapterOptions{TargetModules: []string{"nope"}}, wantErr: "no module"},
		{name: "mtp-never-targeted", base: qwen35, opt: AdapterOptions{TargetRegex: `.*q_proj`},
			modules: []string{"model.layers.3.self_attn.q_proj"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, err := tc.opt.Write(dir, tc.base)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.modules != nil {
				var got []string
				for _, m := range a.Modules {
					got = append(got, m.Module)
				}
				if !reflect.DeepEqual(got, tc.modules) {
					t.Errorf("modules %v, want %v", got, tc.modules)
				}
			}
			f, err := safetensors.Open(filepath.Join(dir, "adapter_model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if len(f.Tensors) != len(a.Tensors) {
				t.Errorf("file has %d tensors, adapter says %d", len(f.Tensors), len(a.Tensors))
			}
			for _, at := range a.Tensors {
				got, ti := readAdapterTensor(t, f, at.Name)
				if ti.DType != at.DType || !reflect.DeepEqual(ti.Shape, at.Shape) {
					t.Errorf("%s: file %s %v, adapter %s %v", at.Name, ti.DType, ti.Shape, at.DType, at.Shape)
				}
				want, err := a.Values(at.Name)
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("%s: stored values differ from Adapter.Values (%v)", at.Name, err)
				}
			}
			for _, m := range a.Modules {
				ta, _ := a.Lookup(m.A)
				tb, _ := a.Lookup(m.B)
				if ta.Shape[0] != int64(m.R) || ta.Shape[1] != m.In || tb.Shape[0] != m.Out || tb.Shape[1] != int64(m.R) {
					t.Errorf("%s: A %v B %v for r=%d in=%d out=%d", m.Module, ta.Shape, tb.Shape, m.R, m.In, m.Out)
				}
			}
			raw, err := os.ReadFile(filepath.Join(dir, "adapter_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			var cfg map[string]any
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.UseNumber()
			if err := dec.Decode(&cfg); err != nil {
				t.Fatal(err)
			}
			if cfg["peft_type"] != "LORA" || cfg["use_dora"] != tc.opt.DoRA || cfg["fan_in_fan_out"] != tc.opt.FanInFanOut {
				t.Errorf("config %v", cfg)
			}
			if tc.check != nil {
				tc.check(t, a, cfg)
			}
		})
	}
}

// checkMagnitude recomputes the DoRA magnitudes' base norms independently
// from Model.Values: each m_i / ‖W‖_i must be 1 + 0.05·N(0,1), so within
// 0.75..1.25 (5σ), with a mean near 1.
func checkMagnitude(t *testing.T, base *Model, a *Adapter, m AdapterModule, perCol bool) {
	t.Helper()
	w, err := base.Values(m.BaseTensor)
	if err != nil {
		t.Fatal(err)
	}
	bt, _ := base.Lookup(m.BaseTensor)
	d0, d1 := int(bt.Shape[0]), int(bt.Shape[1])
	mag, err := a.Values(m.Magnitude)
	if err != nil {
		t.Fatal(err)
	}
	n := d0
	if perCol {
		n = d1
	}
	if len(mag) != n {
		t.Fatalf("%s: %d magnitudes, want %d", m.Module, len(mag), n)
	}
	var sum float64
	for i := 0; i < n; i++ {
		var ss float64
		if perCol {
			for j := 0; j < d0; j++ {
				x := float64(w[j*d1+i])
				ss += x * x
			}
		} else {
			for j := 0; j < d1; j++ {
				x := float64(w[i*d1+j])
				ss += x * x
			}
		}
		r := float64(mag[i]) / math.Sqrt(ss)
		if r < 0.75 || r > 1.25 {
			t.Fatalf("%s: magnitude[%d] / norm = %v", m.Module, i, r)
		}
		sum += r
	}
	// The mean of n draws of 1 + 0.05·N(0,1) has std 0.05/√n; allow 5σ.
	if mean := sum / float64(n); math.Abs(mean-1) > 5*0.05/math.Sqrt(float64(n)) {
		t.Errorf("%s: mean magnitude/norm %v", m.Module, mean)
	}
}

// TestAdapterForDir: an adapter generated from a checkpoint directory is
// byte-identical to one generated from the in-memory Model.
func TestAdapterForDir(t *testing.T) {
	for _, c := range []Common{{Seed: 9}, {Seed: 10, RepeatBlock: 333}} {
		t.Run(fmt.Sprintf("repeat-%d", c.RepeatBlock), func(t *testing.T) {
			root := t.TempDir()
			m, err := Qwen35Options{Common: c}.Write(filepath.Join(root, "base"))
			if err != nil {
				t.Fatal(err)
			}
			opt := AdapterOptions{Seed: 4, R: 4, Alpha: 8, DoRA: true, TargetModules: []string{"in_proj_qkv", "o_proj", "down_proj", "embed_tokens"},
				ModulesToSave: []string{"lm_head"}}
			if _, err := opt.Write(filepath.Join(root, "a"), m); err != nil {
				t.Fatal(err)
			}
			if _, err := opt.WriteForDir(filepath.Join(root, "b"), filepath.Join(root, "base")); err != nil {
				t.Fatal(err)
			}
			da, db := dirDigest(t, filepath.Join(root, "a")), dirDigest(t, filepath.Join(root, "b"))
			if !reflect.DeepEqual(da, db) {
				t.Errorf("adapters differ:\n%v\n%v", da, db)
			}
			cfg, err := os.ReadFile(filepath.Join(root, "a", "adapter_config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(cfg), `"base_model_name_or_path": "../base"`) {
				t.Errorf("base_model_name_or_path not relative: %s", cfg)
			}
		})
	}
}
