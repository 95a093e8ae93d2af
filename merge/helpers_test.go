package merge

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// genTensor is a tensor for a generated checkpoint or adapter.
type genTensor struct {
	name  string
	dtype tensor.DType
	shape []int64
	vals  []float32 // exactly representable in dtype
}

// rng is a small deterministic generator (xorshift64*).
type rng uint64

func (r *rng) next() uint64 {
	x := uint64(*r)
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*r = rng(x)
	return x * 2685821657736338717
}

// uniform returns a value in [-a, a).
func (r *rng) uniform(a float64) float32 {
	return float32((float64(r.next()>>11)/(1<<53)*2 - 1) * a)
}

func gen(seed uint64, name string, dt tensor.DType, a float64, shape ...int64) genTensor {
	r := rng(seed*0x9e3779b97f4a7c15 + 1)
	n, _ := tensor.NumElements(shape)
	v := make([]float32, n)
	for i := range v {
		v[i] = tensor.RoundTo(dt, r.uniform(a))
	}
	return genTensor{name: name, dtype: dt, shape: shape, vals: v}
}

func encode(t testing.TB, g genTensor) []byte {
	t.Helper()
	b := make([]byte, len(g.vals)*g.dtype.Bits()/8)
	if err := tensor.FromF32(g.dtype, b, g.vals); err != nil {
		t.Fatal(err)
	}
	return b
}

func writeTensors(t testing.TB, path string, ts []genTensor) {
	t.Helper()
	specs := make([]safetensors.TensorSpec, len(ts))
	for i, g := range ts {
		specs[i] = safetensors.TensorSpec{Name: g.name, DType: g.dtype, Shape: g.shape}
	}
	w, err := safetensors.Create(path, map[string]string{"format": "pt"}, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range ts {
		if _, err := w.Write(encode(t, g)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeJSONFile(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeBase writes a sharded checkpoint (one shard per group) with a
// config.json and a tokenizer file.
func writeBase(t testing.TB, dir string, groups [][]genTensor) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	wm := map[string]string{}
	var total int64
	for i, g := range groups {
		name := safetensors.ShardName(i+1, len(groups))
		writeTensors(t, filepath.Join(dir, name), g)
		for _, x := range g {
			wm[x.name] = name
			total += int64(len(x.vals) * x.dtype.Bits() / 8)
		}
	}
	if err := safetensors.WriteIndex(dir, wm, total, nil); err != nil {
		t.Fatal(err)
	}
	writeJSONFile(t, filepath.Join(dir, "config.json"), map[string]any{"architectures": []string{"TestForCausalLM"}, "hidden_size": 32})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAdapter writes a PEFT adapter directory.
func writeAdapter(t testing.TB, dir string, cfg map[string]any, ts []genTensor) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	full := map[string]any{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none", "fan_in_fan_out": false,
		"use_dora": false, "use_rslora": false, "rank_pattern": map[string]any{}, "alpha_pattern": map[string]any{}}
	for k, v := range cfg {
		full[k] = v
	}
	writeJSONFile(t, filepath.Join(dir, AdapterConfigName), full)
	writeTensors(t, filepath.Join(dir, AdapterWeightsName), ts)
}

// refLoRA is the straightforward float64 merge of one module, in the stored
// layout: Linear W (out,in) or, with fan_in_fan_out, (in,out); Embedding W
// (vocab,dim) with A (r,vocab), B (dim,r).
type refLoRA struct {
	w           []float32
	rows, cols  int
	a, b, mag   []float32
	r           int
	s           float64
	embedding   bool
	fanInFanOut bool
}

func (m refLoRA) merged() []float64 {
	out := make([]float64, m.rows*m.cols)
	transposed := m.embedding || m.fanInFanOut
	for i := 0; i < m.rows; i++ {
		for j := 0; j < m.cols; j++ {
			// delta in the module's (out,in) sense, then placed.
			var o, in int
			if transposed {
				o, in = j, i // stored (in,out): row is A's column, column is B's row
			} else {
				o, in = i, j
			}
			var d float64
			for k := 0; k < m.r; k++ {
				d += float64(m.b[o*m.r+k]) * float64(m.a[k*m.aCols()+in])
			}
			out[i*m.cols+j] = float64(m.w[i*m.cols+j]) + m.s*d
		}
	}
	if m.mag == nil {
		return out
	}
	if !transposed {
		for i := 0; i < m.rows; i++ {
			var n float64
			for j := 0; j < m.cols; j++ {
				n += out[i*m.cols+j] * out[i*m.cols+j]
			}
			f := float64(m.mag[i]) / math.Sqrt(n)
			for j := 0; j < m.cols; j++ {
				out[i*m.cols+j] *= f
			}
		}
		return out
	}
	for j := 0; j < m.cols; j++ {
		var n float64
		for i := 0; i < m.rows; i++ {
			n += out[i*m.cols+j] * out[i*m.cols+j]
		}
		f := float64(m.mag[j]) / math.Sqrt(n)
		for i := 0; i < m.rows; i++ {
			out[i*m.cols+j] *= f
		}
	}
	return out
}

func (m refLoRA) aCols() int {
	if m.embedding || m.fanInFanOut {
		return m.rows
	}
	return m.cols
}

// readOut reads a tensor of a merged checkpoint as float32.
func readOut(t testing.TB, dir, name string) (safetensors.TensorInfo, []float32) {
	t.Helper()
	c, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, raw := readTensor(t, c, name)
	v := make([]float32, info.NumElements())
	if err := tensor.ToF32(info.DType, v, raw); err != nil {
		t.Fatal(err)
	}
	return info, v
}

// closeTo checks got against the float64 reference: within tol of the
// tensor's largest magnitude (float32 arithmetic against float64).
func closeTo(t testing.TB, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale, worst float64
	for _, w := range want {
		scale = math.Max(scale, math.Abs(w))
	}
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-want[i]))
	}
	if !(worst <= tol*scale) {
		t.Errorf("%s: max |ferry − float64 reference| = %.3g, over %.3g (tol %.0e × max %.3g)", what, worst, tol*scale, tol, scale)
	}
}
