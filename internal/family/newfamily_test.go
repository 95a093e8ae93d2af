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

// writeCheckpoints writes one tiny Qwen3 checkpoint twice, as
// dir/qwen3/m and as dir/ferrytest/m, the second's config.json naming the
// test family.
func writeCheckpoints(t *testing.T) (qwen3, ferry string) {
	t.Helper()
	root := t.TempDir()
	qwen3, ferry = filepath.Join(root, "qwen3", "m"), filepath.Join(root, "ferrytest", "m")
	// Rows of 256, so the K types apply without falling back.
	opts := testmodel.Qwen3Options{Common: testmodel.Common{Seed: 7, HiddenSize: 256, IntermediateSize: 512, NumLayers: 4, NumHeads: 4, NumKVHeads: 2, HeadDim: 64, VocabSize: 512}}
	for _, dir := range []string{qwen3, ferry} {
		if _, err := opts.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(ferry, "config.json")
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["architectures"] = []string{"FerryTestForCausalLM"}
	cfg["model_type"] = "ferry_test"
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return qwen3, ferry
}

func convertTo(t *testing.T, dir, out string) *gguf.File {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := convert.NewPlan(ck, convert.Options{})
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

func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func tensorBytes(t *testing.T, f *gguf.File, ti gguf.TensorInfo) []byte {
	t.Helper()
	b, err := io.ReadAll(f.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// refused checks that nothing takes the test family's checkpoint.
func refused(t *testing.T, dir string) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if _, err := convert.NewPlan(ck, convert.Options{}); !errors.Is(err, convert.ErrUnsupportedArch) || !strings.Contains(err.Error(), `"FerryTestForCausalLM"`) {
		t.Errorf("convert of an unregistered family: %v, want ErrUnsupportedArch naming FerryTestForCausalLM", err)
	}
	if s, err := quantize.OpenSource(dir, quantize.SourceOptions{}); !errors.Is(err, convert.ErrUnsupportedArch) {
		if s != nil {
			s.Close()
		}
		t.Errorf("quantize of an unregistered family's checkpoint: %v, want ErrUnsupportedArch", err)
	}
	if slices.Contains(convert.Supported(), "FerryTestForCausalLM") {
		t.Error("convert.Supported lists the unregistered family")
	}
	if _, err := mlxpack.PlanQuantize(dir, mlxpack.QuantizeOptions{Bits: 4}); !errors.Is(err, mlxpack.ErrUnsupportedFamily) || !strings.Contains(err.Error(), `"ferry_test"`) {
		t.Errorf("mlx quantize of an unregistered family: %v, want ErrUnsupportedFamily naming ferry_test", err)
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

// sameMLX checks that the MLX directory got is want but for config.json's
// architectures and model_type.
func sameMLX(t *testing.T, got, want string) {
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
		t.Errorf("%d files, the Qwen3 directory has %d", len(names), len(entries))
	}
	for _, e := range entries {
		a, err := os.ReadFile(filepath.Join(got, e.Name()))
		if err != nil {
			t.Error(err)
			continue
		}
		b, err := os.ReadFile(filepath.Join(want, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() != "config.json" {
			if !bytes.Equal(a, b) {
				t.Errorf("MLX %s differs from the Qwen3 directory's", e.Name())
			}
			continue
		}
		var ca, cb map[string]any
		if err := json.Unmarshal(a, &ca); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &cb); err != nil {
			t.Fatal(err)
		}
		if ca["model_type"] != "ferry_test" {
			t.Errorf("MLX config model_type %v, want ferry_test", ca["model_type"])
		}
		ca["model_type"], ca["architectures"] = cb["model_type"], cb["architectures"]
		if fmt.Sprint(ca) != fmt.Sprint(cb) {
			t.Errorf("MLX config.json differs from the Qwen3 directory's beyond model_type and architectures:\n%v\n%v", ca, cb)
		}
	}
}

// TestNewFamilyIsOneRegistration: a family defined in this file and
// registered with family.Register converts to GGUF and quantizes through
// the public entry points, and is refused cleanly before it is registered
// and after it is removed. Its GGUF is the Qwen3 writer's conversion of
// the same weights under its own arch (every tensor byte for byte, every
// key the same under the ferrytest. prefix), and its Q4_K_M is Qwen3's but
// for the rule the descriptor changes: attn_v tensors the rules give Q4_K
// get Q5_K in a 70B model. Its MLX 4-bit directory is Qwen3's but for the
// model type.
func TestNewFamilyIsOneRegistration(t *testing.T) {
	qwen3Dir, ferryDir := writeCheckpoints(t)
	refused(t, ferryDir)

	remove, err := family.Register(&ferryTest)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(convert.Supported(), "FerryTestForCausalLM") {
		t.Error("convert.Supported does not list the registered family")
	}

	out := t.TempDir()
	want := convertTo(t, qwen3Dir, filepath.Join(out, "qwen3-F16.gguf"))
	got := convertTo(t, ferryDir, filepath.Join(out, "ferrytest-F16.gguf"))
	if a := got.Architecture(); a != "ferrytest" {
		t.Fatalf("general.architecture %q, want ferrytest", a)
	}
	if len(got.KVs) != len(want.KVs) {
		t.Fatalf("%d KVs, the Qwen3 conversion has %d", len(got.KVs), len(want.KVs))
	}
	for i, kv := range want.KVs {
		key := kv.Key
		if rest, ok := strings.CutPrefix(key, "qwen3."); ok {
			key = "ferrytest." + rest
		}
		g := got.KVs[i]
		if g.Key != key {
			t.Errorf("KV %d is %s, want %s", i, g.Key, key)
			continue
		}
		if key != "general.architecture" && fmt.Sprint(g.Value) != fmt.Sprint(kv.Value) {
			t.Errorf("%s = %v, want %v", key, g.Value, kv.Value)
		}
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Fatalf("%d tensors, the Qwen3 conversion has %d", len(got.Tensors), len(want.Tensors))
	}
	for i, w := range want.Tensors {
		g := got.Tensors[i]
		if g.Name != w.Name || g.Type != w.Type || !slices.Equal(g.Dims, w.Dims) || !bytes.Equal(tensorBytes(t, got, g), tensorBytes(t, want, w)) {
			t.Errorf("tensor %d: %s %s %v, the Qwen3 conversion's is %s %s %v (or the bytes differ)", i, g.Name, g.Type, g.Dims, w.Name, w.Type, w.Dims)
		}
	}

	// Quantized from its GGUF and straight from its checkpoint: the same
	// file; Qwen3's but for the 70B rule on attn_v.
	qWant := quantizeTo(t, filepath.Join(out, "qwen3-F16.gguf"), filepath.Join(out, "qwen3-Q4_K_M.gguf"))
	qGot := quantizeTo(t, filepath.Join(out, "ferrytest-F16.gguf"), filepath.Join(out, "ferrytest-Q4_K_M.gguf"))
	qDirect := quantizeTo(t, ferryDir, filepath.Join(out, "ferrytest-direct-Q4_K_M.gguf"))
	a, err := os.ReadFile(qGot.Path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(qDirect.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("the Q4_K_M quantized from the checkpoint differs from the one quantized from its F16 GGUF")
	}
	changed := 0
	for i, w := range qWant.Tensors {
		g := qGot.Tensors[i]
		wantType := w.Type
		if strings.HasSuffix(w.Name, "attn_v.weight") && w.Type == quant.Q4_K {
			wantType = quant.Q5_K
			changed++
		}
		if g.Name != w.Name || g.Type != wantType {
			t.Errorf("tensor %d: %s %s, want %s %s", i, g.Name, g.Type, w.Name, wantType)
		} else if g.Type == w.Type && !bytes.Equal(tensorBytes(t, qGot, g), tensorBytes(t, qWant, w)) {
			t.Errorf("%s: the bytes differ from the Qwen3 Q4_K_M's", g.Name)
		}
	}
	if changed == 0 {
		t.Error("no attn_v tensor was Q4_K in the Qwen3 Q4_K_M: the 70B rule was not exercised")
	}

	// MLX: mlx quantize writes Qwen3's directory (the same sanitize, layer
	// order, no router gates) but for the model type.
	mlxQuantize(t, qwen3Dir, filepath.Join(out, "qwen3-mlx"))
	mlxQuantize(t, ferryDir, filepath.Join(out, "ferrytest-mlx"))
	sameMLX(t, filepath.Join(out, "ferrytest-mlx"), filepath.Join(out, "qwen3-mlx"))

	remove()
	refused(t, ferryDir)
}
