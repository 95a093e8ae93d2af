package merge

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// poke overwrites element idx of tensor name in the safetensors file path
// with v, encoded in the tensor's dtype.
func poke(t *testing.T, path, name string, idx int64, v float32) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := f.Tensor(name)
	f.Close()
	if !ok {
		t.Fatalf("%s: no tensor %q", path, name)
	}
	es := int64(info.DType.Bits() / 8)
	b := make([]byte, es)
	if err := tensor.FromF32(info.DType, b, []float32{v}); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(b, f.DataOffset()+info.Begin+idx*es); err != nil {
		t.Fatal(err)
	}
}

// shardOf is the base shard file holding tensor name.
func shardOf(t *testing.T, dir, name string) string {
	t.Helper()
	c, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, ok := c.Lookup(name)
	if !ok {
		t.Fatalf("%s: no tensor %q", dir, name)
	}
	return l.Shard.Path
}

var (
	nan  = float32(math.NaN())
	pinf = float32(math.Inf(1))
)

// NaN or Inf that the adapter brings in is refused, naming the tensor and
// the row, before anything is written when it sits in an adapter tensor,
// and with no index and no shard of the failing tensor when the merge
// itself makes it (overflow into F16, a DoRA row norm over a base NaN).
// --allow-nonfinite (AllowNonFinite) merges anyway.
func TestNonFiniteFromAdapter(t *testing.T) {
	const q0 = "model.layers.0.self_attn.q_proj"
	cases := []struct {
		name      string
		fc        int          // featureCases index
		dtype     tensor.DType // PlanOptions.DType
		adapter   string       // adapter tensor to poke ("" for the base)
		base      string       // base tensor to poke
		idx       int64
		v         float32
		tensor    string // the tensor the error names
		where     string // the position the error names
		beforeAny bool   // refused before the output directory exists
	}{
		{name: "lora_B NaN", fc: 0, adapter: prefix + q0 + ".lora_B.weight", idx: 3*4 + 1, v: nan, tensor: prefix + q0 + ".lora_B.weight", where: "row 3, column 1", beforeAny: true},
		{name: "lora_A Inf", fc: 0, adapter: prefix + q0 + ".lora_A.weight", idx: 2*hid + 5, v: pinf, tensor: prefix + q0 + ".lora_A.weight", where: "row 2, column 5", beforeAny: true},
		{name: "magnitude NaN", fc: 7, adapter: prefix + q0 + ".lora_magnitude_vector.weight", idx: 7, v: nan, tensor: prefix + q0 + ".lora_magnitude_vector.weight", where: "element 7", beforeAny: true},
		{name: "lora_B.bias Inf", fc: 10, adapter: prefix + q0 + ".lora_B.bias", idx: 4, v: -pinf, tensor: prefix + q0 + ".lora_B.bias", where: "element 4", beforeAny: true},
		{name: "modules_to_save NaN", fc: 11, adapter: prefix + "lm_head.weight", idx: hid + 1, v: nan, tensor: prefix + "lm_head.weight", where: "row 1, column 1", beforeAny: true},
		{name: "overflow into F16", fc: 0, dtype: tensor.F16, base: q0 + ".weight", idx: 5*hid + 6, v: 70000, tensor: q0 + ".weight", where: "row 5, column 6"},
		{name: "DoRA norm over a base NaN", fc: 7, base: q0 + ".weight", idx: 2*hid + 3, v: nan, tensor: q0 + ".weight", where: "row 2, column 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			baseDir, adapterDir, _, _, _ := buildCase(t, dir, featureCases()[tc.fc])
			if tc.adapter != "" {
				poke(t, filepath.Join(adapterDir, AdapterWeightsName), tc.adapter, tc.idx, tc.v)
			} else {
				poke(t, shardOf(t, baseDir, tc.base), tc.base, tc.idx, tc.v)
			}
			p, err := Inventory(baseDir, adapterDir, PlanOptions{DType: tc.dtype})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			out := filepath.Join(dir, "out")
			_, err = Execute(t.Context(), p, out, ExecOptions{Jobs: 2})
			var ie *InputError
			if !errors.Is(err, ErrNonFinite) || !errors.As(err, &ie) {
				t.Fatalf("error %v, want a bad-input ErrNonFinite", err)
			}
			if ie.Tensor != tc.tensor || !strings.Contains(err.Error(), tc.where) || !strings.Contains(err.Error(), "--allow-nonfinite") {
				t.Errorf("error %q: want tensor %q at %q and the way out", err, tc.tensor, tc.where)
			}
			if tc.beforeAny {
				if _, err := os.Stat(out); !os.IsNotExist(err) {
					t.Errorf("refused merge created %s (%v)", out, err)
				}
			} else {
				for _, f := range []string{safetensors.IndexName, filepath.Base(shardOf(t, baseDir, tc.tensor))} {
					if _, err := os.Stat(filepath.Join(out, f)); !os.IsNotExist(err) {
						t.Errorf("refused merge wrote %s (%v)", f, err)
					}
				}
			}

			// Allowed: the merge completes.
			p2, err := Inventory(baseDir, adapterDir, PlanOptions{DType: tc.dtype})
			if err != nil {
				t.Fatal(err)
			}
			defer p2.Close()
			if _, err := Execute(t.Context(), p2, filepath.Join(dir, "allowed"), ExecOptions{Jobs: 2, AllowNonFinite: true}); err != nil {
				t.Fatalf("with AllowNonFinite: %v", err)
			}
		})
	}
}

// NaN and Inf already in the base are carried through the merge as they
// are (NaN + ΔW is NaN, Inf + ΔW is Inf), counted once per tensor, and
// every other value is what the merge gives without them.
func TestNonFiniteInBase(t *testing.T) {
	fc := featureCases()[0] // LoRA on q_proj and v_proj
	clean, dirty := t.TempDir(), t.TempDir()
	cleanBase, cleanAd, _, _, _ := buildCase(t, clean, fc)
	baseDir, adapterDir, _, _, _ := buildCase(t, dirty, fc)
	q0, v1 := "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.v_proj.weight"
	pokes := map[string]map[int64]float32{q0: {10: nan, 20: -pinf}, v1: {0: pinf}}
	for name, vals := range pokes {
		for i, v := range vals {
			poke(t, shardOf(t, baseDir, name), name, i, v)
		}
	}
	runMerge(t, cleanBase, cleanAd, filepath.Join(clean, "out"), PlanOptions{}, 2)
	p, err := Inventory(baseDir, adapterDir, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := map[string]int64{}
	out := filepath.Join(dirty, "out")
	if _, err := Execute(t.Context(), p, out, ExecOptions{Jobs: 3, BlockElems: 64, NonFinite: func(m int, name string, n int64) {
		if p.Modules[m].Target != name {
			t.Errorf("module %d is %s, reported for %s", m, p.Modules[m].Target, name)
		}
		got[name] += n
	}}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[q0] != 2 || got[v1] != 1 {
		t.Errorf("reported %v, want %s: 2, %s: 1", got, q0, v1)
	}
	for name, vals := range pokes {
		_, want := readOut(t, filepath.Join(clean, "out"), name)
		_, have := readOut(t, out, name)
		for i := range want {
			v, poked := vals[int64(i)]
			switch {
			case poked && math.IsNaN(float64(v)):
				if !math.IsNaN(float64(have[i])) {
					t.Errorf("%s[%d] = %g, want NaN kept", name, i, have[i])
				}
			case poked:
				if have[i] != v {
					t.Errorf("%s[%d] = %g, want %g kept", name, i, have[i], v)
				}
			case math.Float32bits(have[i]) != math.Float32bits(want[i]):
				t.Errorf("%s[%d] = %g, want %g as without the NaN/Inf", name, i, have[i], want[i])
			}
		}
	}
}
