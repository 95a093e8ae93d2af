package family_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/mlxpack"
	"github.com/ferry-llm/ferry/safetensors"
)

// ferryTest is a family no package knows: a Qwen3-shaped decoder saved as
// FerryTestForCausalLM (model_type ferry_test), written as GGUF arch
// ferrytest by the Qwen3Model writer, and, for llama-quantize's rules, an
// arch whose loader calls a 4-block model 70B (so the rules that read the
// arch visibly apply); for MLX a model whose sanitize is llama's. Registering
// this one descriptor is all it takes for the converter and both quantizers
// to take it.
var ferryTest = family.Family{
	Name:       "ferrytest",
	Layouts:    []family.Layout{{Architecture: "FerryTestForCausalLM", Trunk: family.HFTrunk}},
	ModelTypes: []string{"ferry_test"},
	GGUF: &family.GGUF{
		Arch:              "ferrytest",
		Class:             "Qwen3Model",
		Pre:               "qwen2",
		Tensors:           []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down"},
		PostAttentionNorm: "ffn_norm",
		Quant:             family.QuantRules{Blocks70B: 4},
	},
	MLX: &family.MLX{
		ModelType:    "ferry_test",
		Sanitize:     "simple",
		LayerOrder:   family.DenseLayerOrder,
		RopeTopLevel: []string{"rope_theta"},
	},
}

// ferryVL is a vision-language family no package knows, laid out as
// Qwen3.5 is: FerryVLForConditionalGeneration (model_type ferry_vl, its
// text_config ferry_vl_text) with the decoder under
// model.language_model., the tower under model.visual., the MTP head at
// mtp.*; its text GGUF (arch ferryvl) by the Qwen3_5TextModel writer, its
// tower by the Qwen3VLVisionModel --mmproj class, and for MLX qwen3_5's
// sanitize.
var ferryVL = family.Family{
	Name: "ferryvl",
	Layouts: []family.Layout{
		{Architecture: "FerryVLForCausalLM", Trunk: family.HFTrunk},
		{Architecture: "FerryVLForConditionalGeneration", Vision: true, TextConfig: true, Trunk: family.HFLanguageModel, VisionTower: family.HFVisual},
	},
	ModelTypes: []string{"ferry_vl_text", "ferry_vl"},
	MTP:        family.MTP{Convention: family.QwenMTP, Prefix: family.HFMTP, CountKey: "mtp_num_hidden_layers", MLXPrefix: family.MLXQwen35MTP},
	GGUF: &family.GGUF{
		Arch:        "ferryvl",
		Class:       "Qwen3_5TextModel",
		MMProjClass: "Qwen3VLVisionModel",
		Pre:         "qwen35",
		Tensors: []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
			"attn_qkv", "attn_gate", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_norm", "ssm_out",
			"nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm",
			"ssm_beta", "ssm_alpha", "ffn_gate", "ffn_up", "ffn_down"},
		PostAttentionNorm: "post_attention_norm",
	},
	MLX: &family.MLX{
		ModelType:              "ferry_vl",
		Aliases:                []string{"ferry_vl_text"},
		Trunk:                  family.MLXQwen35Trunk,
		Sanitize:               "qwen3_5",
		LayerOrder:             family.HybridLayerOrder,
		RouterGates:            []string{"mlp.gate", "shared_expert_gate"},
		RouterGatesNeedExperts: true,
		KeepDType:              []string{"A_log"},
		RopeTypeAsType:         true,
	},
}

// twins writes one checkpoint twice, as root/ref/m and root/new/m, and
// rewrites the second's config.json with rename.
func twins(t *testing.T, write func(dir string) error, rename func(cfg map[string]any)) (ref, renamed string) {
	t.Helper()
	root := t.TempDir()
	ref, renamed = filepath.Join(root, "ref", "m"), filepath.Join(root, "new", "m")
	for _, dir := range []string{ref, renamed} {
		if err := write(dir); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(renamed, "config.json")
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	rename(cfg)
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return ref, renamed
}

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func convertTo(t *testing.T, dir, out string, opts convert.Options) *gguf.File {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := convert.NewPlan(ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := convert.Run(context.Background(), ck, p, out, convert.RunOptions{Jobs: 2, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return openGGUF(t, out)
}

func quantizeTo(t *testing.T, src, out string) *gguf.File {
	t.Helper()
	s, err := quantize.OpenSource(src, quantize.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.NewPlan(quantize.Options{FileType: quant.FileQ4_K_M})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quantize.Run(context.Background(), s.File, p, out, quantize.RunOptions{Jobs: 2, NoSync: true}); err != nil {
		t.Fatal(err)
	}
	return openGGUF(t, out)
}

func tensorBytes(t *testing.T, f *gguf.File, ti gguf.TensorInfo) []byte {
	t.Helper()
	b, err := io.ReadAll(f.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameGGUF checks that got is want but for the arch: every KV the same
// (under toArch. where want has fromArch.), every tensor the same, byte for
// byte, except where wantType gives another type (then only the name).
func sameGGUF(t *testing.T, got, want *gguf.File, fromArch, toArch string, wantType func(gguf.TensorInfo) quant.Type) {
	t.Helper()
	if a := got.Architecture(); a != toArch {
		t.Fatalf("general.architecture %q, want %s", a, toArch)
	}
	if len(got.KVs) != len(want.KVs) {
		t.Fatalf("%d KVs, the reference has %d", len(got.KVs), len(want.KVs))
	}
	for i, kv := range want.KVs {
		key := kv.Key
		if rest, ok := strings.CutPrefix(key, fromArch+"."); ok {
			key = toArch + "." + rest
		}
		g := got.KVs[i]
		if g.Key != key {
			t.Errorf("KV %d is %s, want %s", i, g.Key, key)
		} else if key != "general.architecture" && fmt.Sprint(g.Value) != fmt.Sprint(kv.Value) {
			t.Errorf("%s = %v, want %v", key, g.Value, kv.Value)
		}
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("%d tensors, the reference has %d", len(got.Tensors), len(want.Tensors))
	}
	for i, w := range want.Tensors {
		g, typ := got.Tensors[i], wantType(w)
		switch {
		case g.Name != w.Name || g.Type != typ || !slices.Equal(g.Dims, w.Dims):
			t.Errorf("tensor %d: %s %s %v, want %s %s %v", i, g.Name, g.Type, g.Dims, w.Name, typ, w.Dims)
		case typ == w.Type && !bytes.Equal(tensorBytes(t, got, g), tensorBytes(t, want, w)):
			t.Errorf("%s: the bytes differ from the reference's", g.Name)
		}
	}
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		t.Errorf("%s differs from %s", a, b)
	}
}

func asIs(ti gguf.TensorInfo) quant.Type { return ti.Type }

// refused checks that nothing takes an unregistered family's checkpoint.
func refused(t *testing.T, dir, arch, modelType string) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if _, err := convert.NewPlan(ck, convert.Options{}); !errors.Is(err, convert.ErrUnsupportedArch) || !strings.Contains(err.Error(), `"`+arch+`"`) {
		t.Errorf("convert of an unregistered family: %v, want ErrUnsupportedArch naming %s", err, arch)
	}
	if s, err := quantize.OpenSource(dir, quantize.SourceOptions{}); !errors.Is(err, convert.ErrUnsupportedArch) {
		if s != nil {
			s.Close()
		}
		t.Errorf("quantize of an unregistered family's checkpoint: %v, want ErrUnsupportedArch", err)
	}
	if slices.Contains(convert.Supported(), arch) {
		t.Errorf("convert.Supported lists the unregistered %s", arch)
	}
	if _, err := mlxpack.PlanQuantize(dir, mlxpack.QuantizeOptions{Bits: 4}); !errors.Is(err, mlxpack.ErrUnsupportedFamily) || !strings.Contains(err.Error(), `"`+modelType+`"`) {
		t.Errorf("mlx quantize of an unregistered family: %v, want ErrUnsupportedFamily naming %s", err, modelType)
	}
}

// mlxQuantize writes src quantized to 4 bits, group 64, as dir.
func mlxQuantize(t *testing.T, src, dir string) {
	t.Helper()
	p, err := mlxpack.PlanQuantize(src, mlxpack.QuantizeOptions{Bits: 4, GroupSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := mlxpack.Quantize(context.Background(), p, dir, mlxpack.QuantizeRunOptions{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
}

// sameMLX checks that the MLX directory got is want, every file byte for
// byte, but config.json, which is want's once restore has put the
// reference's names back.
func sameMLX(t *testing.T, got, want string, restore func(got, want map[string]any)) {
	t.Helper()
	entries, err := os.ReadDir(want)
	if err != nil {
		t.Fatal(err)
	}
	names, err := os.ReadDir(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(entries) {
		t.Errorf("%d files, the reference directory has %d", len(names), len(entries))
	}
	for _, e := range entries {
		if e.Name() != "config.json" {
			sameFile(t, filepath.Join(got, e.Name()), filepath.Join(want, e.Name()))
			continue
		}
		var cfg [2]map[string]any
		for i, dir := range []string{got, want} {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &cfg[i]); err != nil {
				t.Fatal(err)
			}
		}
		restore(cfg[0], cfg[1])
		if fmt.Sprint(cfg[0]) != fmt.Sprint(cfg[1]) {
			t.Errorf("MLX config.json differs from the reference's beyond the names:\n%v\n%v", cfg[0], cfg[1])
		}
	}
}

// TestNewFamilyIsOneRegistration: a family defined in this file and
// registered with family.Register converts to GGUF and quantizes (GGUF
// and MLX) through the public entry points, and is refused cleanly before
// it is registered and after it is removed. Its GGUF is the Qwen3 writer's
// conversion of the same weights under its own arch (every tensor byte for
// byte, every key the same under the ferrytest. prefix), and its Q4_K_M is
// Qwen3's but for the rule the descriptor changes: attn_v tensors the rules
// give Q4_K get Q5_K in a 70B model. Its MLX 4-bit directory is Qwen3's but
// for the model type.
func TestNewFamilyIsOneRegistration(t *testing.T) {
	// Rows of 256, so the K types apply without falling back.
	opts := testmodel.Qwen3Options{Common: testmodel.Common{Seed: 7, HiddenSize: 256, IntermediateSize: 512, NumLayers: 4, NumHeads: 4, NumKVHeads: 2, HeadDim: 64, VocabSize: 512}}
	qwen3Dir, ferryDir := twins(t, func(dir string) error { _, err := opts.Write(dir); return err }, func(cfg map[string]any) {
		cfg["architectures"], cfg["model_type"] = []string{"FerryTestForCausalLM"}, "ferry_test"
	})
	refused(t, ferryDir, "FerryTestForCausalLM", "ferry_test")

	remove, err := family.Register(&ferryTest)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(convert.Supported(), "FerryTestForCausalLM") {
		t.Error("convert.Supported does not list the registered family")
	}

	out := t.TempDir()
	want := convertTo(t, qwen3Dir, filepath.Join(out, "qwen3-F16.gguf"), convert.Options{})
	got := convertTo(t, ferryDir, filepath.Join(out, "ferrytest-F16.gguf"), convert.Options{})
	sameGGUF(t, got, want, "qwen3", "ferrytest", asIs)

	// Quantized from its GGUF and straight from its checkpoint: the same
	// file; Qwen3's but for the 70B rule on attn_v.
	qWant := quantizeTo(t, want.Path, filepath.Join(out, "qwen3-Q4_K_M.gguf"))
	qGot := quantizeTo(t, got.Path, filepath.Join(out, "ferrytest-Q4_K_M.gguf"))
	qDirect := quantizeTo(t, ferryDir, filepath.Join(out, "ferrytest-direct-Q4_K_M.gguf"))
	sameFile(t, qDirect.Path, qGot.Path)
	changed := 0
	sameGGUF(t, qGot, qWant, "qwen3", "ferrytest", func(w gguf.TensorInfo) quant.Type {
		if strings.HasSuffix(w.Name, "attn_v.weight") && w.Type == quant.Q4_K {
			changed++
			return quant.Q5_K
		}
		return w.Type
	})
	if changed == 0 {
		t.Error("no attn_v tensor was Q4_K in the Qwen3 Q4_K_M: the 70B rule was not exercised")
	}

	mlxQuantize(t, qwen3Dir, filepath.Join(out, "qwen3-mlx"))
	mlxQuantize(t, ferryDir, filepath.Join(out, "ferrytest-mlx"))
	sameMLX(t, filepath.Join(out, "ferrytest-mlx"), filepath.Join(out, "qwen3-mlx"), func(got, want map[string]any) {
		if got["model_type"] != "ferry_test" {
			t.Errorf("MLX config model_type %v, want ferry_test", got["model_type"])
		}
		got["model_type"], got["architectures"] = want["model_type"], want["architectures"]
	})

	remove()
	refused(t, ferryDir, "FerryTestForCausalLM", "ferry_test")
}

// TestNewVisionLanguageFamily: a vision-language family defined in this
// file, once registered, converts (text GGUF and --mmproj) and quantizes
// (GGUF and MLX) as the Qwen3.5 family its descriptor borrows its writer
// classes and sanitize from: the text GGUF is Qwen3.5's under arch ferryvl,
// the mmproj and the MLX shards are byte for byte Qwen3.5's.
func TestNewVisionLanguageFamily(t *testing.T) {
	opts := testmodel.Qwen35Options{Common: testmodel.Common{Seed: 9}, Vision: &testmodel.Vision{}}
	qwenDir, ferryDir := twins(t, func(dir string) error { _, err := opts.Write(dir); return err }, func(cfg map[string]any) {
		cfg["architectures"], cfg["model_type"] = []string{"FerryVLForConditionalGeneration"}, "ferry_vl"
		cfg["text_config"].(map[string]any)["model_type"] = "ferry_vl_text"
	})
	refused(t, ferryDir, "FerryVLForConditionalGeneration", "ferry_vl")
	remove, err := family.Register(&ferryVL)
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	if !slices.Contains(convert.MMProjSupported(), "FerryVLForConditionalGeneration") || slices.Contains(convert.MMProjSupported(), "FerryVLForCausalLM") {
		t.Errorf("convert.MMProjSupported() = %v, want the vision-language layout only", convert.MMProjSupported())
	}

	out := t.TempDir()
	want := convertTo(t, qwenDir, filepath.Join(out, "qwen35-F16.gguf"), convert.Options{})
	got := convertTo(t, ferryDir, filepath.Join(out, "ferryvl-F16.gguf"), convert.Options{})
	sameGGUF(t, got, want, "qwen35", "ferryvl", asIs)
	if _, ok := got.KV("ferryvl.nextn_predict_layers"); !ok {
		t.Error("the MTP head was not kept as NextN blocks")
	}
	mmWant := convertTo(t, qwenDir, filepath.Join(out, "mmproj-qwen35.gguf"), convert.Options{MMProj: true})
	mmGot := convertTo(t, ferryDir, filepath.Join(out, "mmproj-ferryvl.gguf"), convert.Options{MMProj: true})
	sameFile(t, mmGot.Path, mmWant.Path)

	qWant := quantizeTo(t, want.Path, filepath.Join(out, "qwen35-Q4_K_M.gguf"))
	qGot := quantizeTo(t, got.Path, filepath.Join(out, "ferryvl-Q4_K_M.gguf"))
	sameGGUF(t, qGot, qWant, "qwen35", "ferryvl", asIs)

	mlxQuantize(t, qwenDir, filepath.Join(out, "qwen35-mlx"))
	mlxQuantize(t, ferryDir, filepath.Join(out, "ferryvl-mlx"))
	sameMLX(t, filepath.Join(out, "ferryvl-mlx"), filepath.Join(out, "qwen35-mlx"), func(got, want map[string]any) {
		got["model_type"], got["architectures"] = want["model_type"], want["architectures"]
		gt, _ := got["text_config"].(map[string]any)
		wt, _ := want["text_config"].(map[string]any)
		if gt == nil || wt == nil || gt["model_type"] != "ferry_vl_text" {
			t.Errorf("MLX config text_config %v, want model_type ferry_vl_text", gt)
			return
		}
		gt["model_type"] = wt["model_type"]
	})
}
