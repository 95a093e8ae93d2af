package merge

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// copyAdapter copies the reference qwen3 DoRA adapter, keeping the tensors
// keep accepts, and adding extra.
func copyAdapter(t *testing.T, dst string, keep func(string) bool, extra ...genTensor) {
	t.Helper()
	src := "testdata/reference/qwen3/adapters/dora"
	f, err := safetensors.Open(filepath.Join(src, AdapterWeightsName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []genTensor
	for _, ti := range f.Tensors {
		if !keep(ti.Name) {
			continue
		}
		raw := make([]byte, ti.Size())
		if _, err := f.Section(ti).ReadAt(raw, 0); err != nil {
			t.Fatal(err)
		}
		v := make([]float32, ti.NumElements())
		tensor.ToF32(ti.DType, v, raw)
		ts = append(ts, genTensor{name: ti.Name, dtype: ti.DType, shape: ti.Shape, vals: v})
	}
	ts = append(ts, extra...)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTensors(t, filepath.Join(dst, AdapterWeightsName), ts)
	cfg, err := os.ReadFile(filepath.Join(src, AdapterConfigName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, AdapterConfigName), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBadInputs: each bad input is refused by Inventory, before any output
// exists, with a bad-input error naming what is wrong.
func TestBadInputs(t *testing.T) {
	qwen3 := "testdata/reference/qwen3/base"
	qwen35 := "../testdata/models/qwen35-tiny/base"
	all := func(string) bool { return true }
	cases := []struct {
		name     string
		base     string
		setup    func(t *testing.T, dir string) // builds the adapter in dir
		sentinel error
		mention  []string
	}{
		{"adapter-for-another-model", qwen35, func(t *testing.T, dir string) { copyAdapter(t, dir, all) },
			ErrUnusedTensors, []string{"self_attn", "--allow-unused"}},
		{"hidden-size-mismatch", "", func(t *testing.T, dir string) {
			writeAdapter(t, dir, map[string]any{"target_modules": []string{"q_proj"}}, []genTensor{
				gen(1, prefix+"model.layers.0.self_attn.q_proj.lora_A.weight", tensor.F32, 1, 4, 64),
				gen(2, prefix+"model.layers.0.self_attn.q_proj.lora_B.weight", tensor.F32, 1, 64, 4),
			})
		}, ErrShapeMismatch, []string{"lora_A.weight", "64 inputs", "model.layers.0.self_attn.q_proj.weight", "[32 32]"}},
		{"missing-magnitudes", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, func(n string) bool { return !strings.Contains(n, "magnitude") })
		}, ErrMissingMagnitude, []string{"lora_magnitude_vector"}},
		{"pickle-only", qwen3, func(t *testing.T, dir string) {
			os.MkdirAll(dir, 0o755)
			cfg, _ := os.ReadFile("testdata/reference/qwen3/adapters/dora/adapter_config.json")
			os.WriteFile(filepath.Join(dir, AdapterConfigName), cfg, 0o644)
			os.WriteFile(filepath.Join(dir, "adapter_model.bin"), []byte("PK\x03\x04 not really a pickle"), 0o644)
		}, ErrPickleOnly, []string{"adapter_model.bin", "pickle"}},
		{"unused-keys", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all, gen(7, prefix+"model.layers.0.self_attn.q_proj.lora_C.weight", tensor.F32, 1, 8, 256),
				gen(8, prefix+"model.layers.9.mlp.gate_proj.lora_A.weight", tensor.F32, 1, 8, 256))
		}, ErrUnusedTensors, []string{"lora_C.weight", "layers.9"}},
		{"rank-mismatch", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all)
			cfg, _ := os.ReadFile(filepath.Join(dir, AdapterConfigName))
			os.WriteFile(filepath.Join(dir, AdapterConfigName), []byte(strings.Replace(string(cfg), `"r": 8`, `"r": 16`, 1)), 0o644)
		}, ErrRankMismatch, []string{"rank 16"}},
		{"bad-config", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all)
			os.WriteFile(filepath.Join(dir, AdapterConfigName), []byte(`{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]`), 0o644)
		}, ErrAdapterConfig, []string{"adapter_config.json"}},
		{"unsupported-option", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all)
			cfg, _ := os.ReadFile(filepath.Join(dir, AdapterConfigName))
			os.WriteFile(filepath.Join(dir, AdapterConfigName), []byte(strings.Replace(string(cfg), `"layer_replication": null`, `"layer_replication": [[0, 2]]`, 1)), 0o644)
		}, ErrAdapterConfig, []string{"layer_replication"}},
		{"corrupt-adapter", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all)
			p := filepath.Join(dir, AdapterWeightsName)
			st, _ := os.Stat(p)
			os.Truncate(p, st.Size()-100)
		}, safetensors.ErrTruncated, []string{AdapterWeightsName, "offset"}},
		{"corrupt-adapter-header", qwen3, func(t *testing.T, dir string) {
			copyAdapter(t, dir, all)
			p := filepath.Join(dir, AdapterWeightsName)
			b, _ := os.ReadFile(p)
			copy(b[8:], `{"x":`)
			os.WriteFile(p, b, 0o644)
		}, safetensors.ErrInvalidHeader, []string{AdapterWeightsName}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			base := tc.base
			if base == "" {
				base = filepath.Join(dir, "base")
				genBase(t, base, "model.", tensor.BF16)
			}
			ad := filepath.Join(dir, "adapter")
			tc.setup(t, ad)
			p, err := Inventory(base, ad, PlanOptions{})
			if err == nil {
				p.Close()
				t.Fatal("Inventory accepted it")
			}
			if !errors.Is(err, tc.sentinel) {
				t.Errorf("error %v\nis not %v", err, tc.sentinel)
			}
			var bi interface{ BadInput() bool }
			if !errors.As(err, &bi) || !bi.BadInput() {
				t.Errorf("error %v is not a bad-input error (exit 2)", err)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error does not mention %q: %v", m, err)
				}
			}
			t.Logf("%v", err)
		})
	}
}

// TestAllowUnused: --allow-unused merges what it can and lists the rest.
func TestAllowUnused(t *testing.T) {
	dir := t.TempDir()
	ad := filepath.Join(dir, "adapter")
	copyAdapter(t, ad, func(string) bool { return true }, gen(7, prefix+"model.layers.0.self_attn.q_proj.lora_C.weight", tensor.F32, 1, 8, 256))
	p, err := Inventory("testdata/reference/qwen3/base", ad, PlanOptions{AllowUnused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.Unused) != 1 || !strings.HasSuffix(p.Unused[0], "lora_C.weight") || len(p.Modules) != 14 {
		t.Errorf("unused %v, %d modules", p.Unused, len(p.Modules))
	}
}

// TestOutputDirRules: a foreign non-empty directory, a plain file and the inputs
// themselves are refused; a finished merge's directory (which keeps no
// journal) and a journal of a different plan too.
func TestOutputDirRules(t *testing.T) {
	dir := t.TempDir()
	base := "testdata/reference/qwen3/base"
	p, err := Inventory(base, "testdata/reference/qwen3/adapters/rslora", PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	foreign := filepath.Join(dir, "foreign")
	os.MkdirAll(foreign, 0o755)
	os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o644)
	file := filepath.Join(dir, "a-file")
	os.WriteFile(file, []byte("mine"), 0o644)
	for _, out := range []string{foreign, base, file} {
		if _, err := Execute(t.Context(), p, out, ExecOptions{}); !errors.Is(err, ErrOutputExists) {
			t.Errorf("%s: %v, want ErrOutputExists", out, err)
		}
		var bi interface{ BadInput() bool }
		if _, err := Execute(t.Context(), p, out, ExecOptions{}); !errors.As(err, &bi) || !bi.BadInput() {
			t.Errorf("%s: %v is not a bad-input error (exit 2)", out, err)
		}
	}
	out := filepath.Join(dir, "out")
	if _, err := Execute(t.Context(), p, out, ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	assertOnlyArtifact(t, out)
	q, err := Inventory(base, "testdata/reference/qwen3/adapters/dora", PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	// Without a journal, a finished output is like any non-empty directory:
	// neither another plan nor this one writes over it.
	for _, pl := range []*Plan{q, p} {
		if _, err := Execute(t.Context(), pl, out, ExecOptions{}); !errors.Is(err, ErrOutputExists) {
			t.Errorf("merge into a finished dir: %v, want ErrOutputExists", err)
		}
	}
	// An interrupted merge's journal of another plan is refused.
	os.WriteFile(filepath.Join(out, JournalName), []byte(`{"ref":"another plan"}`+"\n"), 0o644)
	if _, err := Execute(t.Context(), q, out, ExecOptions{}); !errors.Is(err, ErrJournal) {
		t.Errorf("other plan's journal: %v, want ErrJournal", err)
	}
}
