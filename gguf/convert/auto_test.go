package convert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// --outtype auto looks past a matrix that is neither BF16 nor F16: the
// qwen3 reference (BF16) with the first matrix in the converter's scan
// order stored as F32 still converts as BF16, as convert_hf_to_gguf.py's
// ModelBase.__init__ decides at 34af94c (a loop over get_tensors that
// skips 1-D tensors and breaks at the first BF16 or F16 one).
func TestAutoOutTypeSkipsF32Matrix(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "base")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := safetensors.OpenDir(qwen3Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// The first ≥2-D tensor in the converter's order.
	var first string
	indexOrder(src, func(sh *safetensors.Shard, ti safetensors.TensorInfo) error {
		if first == "" && len(ti.Shape) >= 2 {
			first = ti.Name
		}
		return nil
	})
	ents, _ := os.ReadDir(qwen3Dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(qwen3Dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Rewrite the shard holding it with that tensor widened to F32.
	loc, _ := src.Lookup(first)
	sh := loc.Shard
	var specs []safetensors.TensorSpec
	for _, ti := range sh.Tensors {
		dt := ti.DType
		if ti.Name == first {
			dt = tensor.F32
		}
		specs = append(specs, safetensors.TensorSpec{Name: ti.Name, DType: dt, Shape: ti.Shape})
	}
	w, err := safetensors.Create(filepath.Join(dir, sh.Name), nil, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range sh.Tensors {
		b := make([]byte, ti.Size())
		if _, err := sh.Section(ti).ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		if ti.Name == first {
			f := make([]float32, len(b)/2)
			tensor.BF16ToF32(f, b)
			b = make([]byte, 4*len(f))
			tensor.F32ToBytes(b, f)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := NewPlan(ck, Options{OutType: OutAuto})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.OutType; got != OutBF16 {
		t.Errorf("auto with %s stored as F32 first: %s, want bf16", first, got)
	}
}
