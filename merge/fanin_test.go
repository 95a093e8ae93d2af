package merge

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/tensor"
)

// A fan_in_fan_out that the layers contradict gets one warning for all of
// them, not one per module, and the plan records each module's layout.
func TestFanInFanOutWarning(t *testing.T) {
	for _, tc := range []struct {
		fc      string
		warning string // "" for none
		fifo    map[string]bool
	}{
		{fc: "fan-in-fan-out-set-on-linear", warning: "fan_in_fan_out is set to True but 2 target modules are torch.nn.Linear",
			fifo: map[string]bool{"model.layers.0.self_attn.q_proj": false, "model.layers.1.mlp.down_proj": false}},
		{fc: "fan-in-fan-out-unset-on-conv1d", warning: "fan_in_fan_out is set to False but 1 target modules are Conv1D",
			fifo: map[string]bool{"model.layers.0.mlp.c_fc": true, "model.layers.1.self_attn.v_proj": false}},
		{fc: "fan-in-fan-out", fifo: map[string]bool{"model.layers.0.mlp.c_fc": true, "model.layers.1.mlp.c_fc": true}},
		{fc: "lora"},
	} {
		t.Run(tc.fc, func(t *testing.T) {
			var fc featureCase
			for _, c := range featureCases() {
				if c.name == tc.fc {
					fc = c
				}
			}
			baseDir, adapterDir, _, _, _ := buildCase(t, t.TempDir(), fc)
			p, err := Inventory(baseDir, adapterDir, PlanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var got []string
			for _, w := range p.Warnings {
				if strings.Contains(w, "fan_in_fan_out") {
					got = append(got, w)
				}
			}
			switch {
			case tc.warning == "" && len(got) > 0:
				t.Errorf("warnings %q, want none", got)
			case tc.warning != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.warning)):
				t.Errorf("warnings %q, want one starting %q", got, tc.warning)
			}
			for _, m := range p.Modules {
				if want, ok := tc.fifo[m.Name]; ok && m.FanInFanOut != want {
					t.Errorf("%s: fan_in_fan_out %v, want %v", m.Name, m.FanInFanOut, want)
				}
			}
		})
	}
}

// A square weight fits both layouts; the model family decides, as the
// layer class does in transformers: GPT-2's attn.c_proj is a Conv1D
// (stored [in, out]), a Llama-style q_proj of the same shape a Linear. The
// merge follows, checked against the float64 reference.
func TestFanInFanOutSquare(t *testing.T) {
	for _, tc := range []struct {
		modelType, module string
		flag, conv1D      bool
	}{
		{"gpt2", "transformer.h.0.attn.c_proj", true, true},
		{"gpt2", "transformer.h.0.attn.c_proj", false, true},
		{"llama", "transformer.h.0.attn.c_proj", true, false},
		{"gpt2", "transformer.h.0.attn.q_proj", true, false},
		{"", "transformer.h.0.attn.c_proj", true, false},
	} {
		t.Run(fmt.Sprintf("%s-%s-%v", tc.modelType, tc.module, tc.flag), func(t *testing.T) {
			dir := t.TempDir()
			baseDir, adapterDir := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
			w := gen(7, tc.module+".weight", tensor.BF16, 0.2, hid, hid)
			writeBase(t, baseDir, [][]genTensor{{w, gen(8, "transformer.ln_f.weight", tensor.BF16, 1, hid)}})
			writeJSONFile(t, filepath.Join(baseDir, "config.json"), map[string]any{"architectures": []string{"X"}, "model_type": tc.modelType})
			a := gen(9, prefix+tc.module+".lora_A.weight", tensor.F32, 0.5, 4, hid)
			b := gen(10, prefix+tc.module+".lora_B.weight", tensor.F32, 0.1, hid, 4)
			last := tc.module[strings.LastIndexByte(tc.module, '.')+1:]
			writeAdapter(t, adapterDir, map[string]any{"target_modules": []string{last}, "fan_in_fan_out": tc.flag, "r": 4, "lora_alpha": 8}, []genTensor{a, b})
			p, _ := runMerge(t, baseDir, adapterDir, filepath.Join(dir, "out"), PlanOptions{DType: tensor.F32}, 2)
			if len(p.Modules) != 1 || p.Modules[0].FanInFanOut != tc.conv1D {
				t.Fatalf("modules %+v, want fan_in_fan_out %v", p.Modules, tc.conv1D)
			}
			ref := refLoRA{w: w.vals, rows: hid, cols: hid, a: a.vals, b: b.vals, r: 4, s: 2, fanInFanOut: tc.conv1D}
			_, got := readOut(t, filepath.Join(dir, "out"), tc.module+".weight")
			closeTo(t, tc.module, got, ref.merged(), 1e-5)
		})
	}
}
