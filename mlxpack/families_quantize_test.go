package mlxpack

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// TestFamilySanitize converts each tiny checkpoint ferry generates (every
// family mlx quantize supports beyond the two references) without
// quantizing and checks what mlx-lm's sanitize makes of it: names, the
// stacked and split experts' bytes (the experts' own, in order), conv1d
// in MLX layout, the norm shift; then quantized, that router gates are at
// 8 bits, group 64, in the config block.
func TestFamilySanitize(t *testing.T) {
	for _, fam := range testmodel.ConverterFamilyNames() {
		t.Run(fam, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "src")
			m, err := testmodel.ConverterFamilies[fam](src)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "mlx")
			res := convertTo(t, src, out, QuantizeOptions{}, QuantizeRunOptions{Jobs: 2})
			got := readOutputs(t, out)
			for name := range got {
				switch {
				case strings.Contains(name, ".experts."), strings.Contains(name, "mtp."), strings.HasPrefix(name, "model.language_model."):
					t.Errorf("%s: mlx-lm's sanitize does not leave this name", name)
				case strings.Contains(name, "conv1d.weight") && got[name].shape[2] != 1:
					t.Errorf("%s: shape %v, want MLX [C, K, 1]", name, got[name].shape)
				}
			}
			if res.MTPDropped != len(m.MTPNames()) {
				t.Errorf("dropped %d MTP tensors, the checkpoint has %d", res.MTPDropped, len(m.MTPNames()))
			}
			// Stacked experts: the stack is the experts' bytes in order.
			perExpert := regexp.MustCompile(`^(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$`)
			stacks := map[string][]byte{}
			for _, n := range m.Names() {
				if strings.Contains(n, "mtp.") {
					continue
				}
				if mm := perExpert.FindStringSubmatch(n); mm != nil {
					key := mlxName(res.ModelType, mm[1]+".switch_mlp."+mm[3]+".weight")
					b, err := m.Bytes(n)
					if err != nil {
						t.Fatal(err)
					}
					stacks[key] = append(stacks[key], b...) // m.Names is in expert order within a module
				}
			}
			experts := len(stacks)
			for key, want := range stacks {
				if !bytes.Equal(got[key].data, want) {
					t.Errorf("%s: not the per-expert tensors stacked in expert order", key)
				}
			}
			// Fused gate_up_proj [E, 2I, H]: gate is each expert's first
			// half, up the second.
			for _, n := range m.Names() {
				if !strings.HasSuffix(n, ".experts.gate_up_proj") || strings.Contains(n, "mtp.") {
					continue
				}
				tt, _ := m.Lookup(n)
				b, _ := m.Bytes(n)
				E, half := tt.Shape[0], int(tt.Shape[1]/2*tt.Shape[2]*2)
				var gate, up []byte
				for e := 0; e < int(E); e++ {
					gate = append(gate, b[2*e*half:(2*e+1)*half]...)
					up = append(up, b[(2*e+1)*half:(2*e+2)*half]...)
				}
				experts++
				prefix := mlxName(res.ModelType, strings.TrimSuffix(n, ".experts.gate_up_proj"))
				if !bytes.Equal(got[prefix+".switch_mlp.gate_proj.weight"].data, gate) || !bytes.Equal(got[prefix+".switch_mlp.up_proj.weight"].data, up) {
					t.Errorf("%s: not split into gate (first half) and up (second half)", n)
				}
			}
			// Quantized: router gates at 8 bits where mlx-lm's predicate
			// says so.
			qout := filepath.Join(t.TempDir(), "q")
			qres := convertTo(t, src, qout, QuantizeOptions{Bits: 4, GroupSize: 32}, QuantizeRunOptions{Jobs: 2})
			gates := 0
			for _, tr := range qres.Tensors {
				gate := strings.HasSuffix(tr.Module, "mlp.gate") || (qres.ModelType != "qwen3_moe" && strings.HasSuffix(tr.Module, "shared_expert_gate"))
				if !gate {
					continue
				}
				gates++
				entry, ok := qres.Quantization[tr.Module].(map[string]any)
				if tr.Bits != 8 || tr.GroupSize != 64 || !ok || entry["bits"] != json.Number("8") {
					t.Errorf("%s: %d bits group %d, config entry %v; want mlx-lm's 8 bits, group 64", tr.Module, tr.Bits, tr.GroupSize, qres.Quantization[tr.Module])
				}
			}
			if moe := strings.Contains(fam, "moe") || strings.Contains(fam, "next"); moe && (experts == 0 || gates == 0) {
				t.Errorf("a MoE family with %d expert stacks and %d router gates checked", experts, gates)
			}
		})
	}
}

// mlxName is where sanitize puts a checkpoint name.
func mlxName(modelType, n string) string {
	if !strings.HasPrefix(modelType, "qwen3_5") {
		return n
	}
	if rest, ok := strings.CutPrefix(n, "model.language_model."); ok {
		return "language_model.model." + rest
	}
	return "language_model." + n
}

type outTensorData struct {
	dtype tensor.DType
	shape []int64
	data  []byte
}

// readOutputs reads every tensor of an MLX directory's model*.safetensors
// (the files mlx-lm's loader globs).
func readOutputs(t *testing.T, dir string) map[string]outTensorData {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "model*.safetensors"))
	if len(files) == 0 {
		t.Fatalf("%s: no model*.safetensors", dir)
	}
	m := map[string]outTensorData{}
	for _, path := range files {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range f.Tensors {
			b := make([]byte, ti.Size())
			if _, err := f.Section(ti).ReadAt(b, 0); err != nil && ti.Size() > 0 {
				t.Fatal(err)
			}
			if _, dup := m[ti.Name]; dup {
				t.Errorf("%s: tensor %s in two files", path, ti.Name)
			}
			m[ti.Name] = outTensorData{ti.DType, ti.Shape, b}
		}
		f.Close()
	}
	return m
}
