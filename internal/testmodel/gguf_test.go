package testmodel

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// WriteGGUF writes a valid GGUF of the planned tensors whose values are
// the generator's, repeated every 64Ki values, rounded through F16.
func TestWriteGGUF(t *testing.T) {
	o := GGUFOptions{Seed: 3, Layers: 2, NextN: true, Hidden: 64, FF: 96, Vocab: 1100, Heads: 2, KVHeads: 1, HeadDim: 32}
	p := filepath.Join(t.TempDir(), "m.gguf")
	size, err := o.WriteGGUF(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size != size || len(f.Tensors) != 1+3*11+4+2 {
		t.Fatalf("size %d (said %d), %d tensors", f.Size, size, len(f.Tensors))
	}
	if kv, _ := f.KV("qwen35.nextn_predict_layers"); kv.Value != uint32(1) {
		t.Errorf("nextn_predict_layers %v", kv.Value)
	}
	if _, ok := f.Tensor("blk.2.nextn.eh_proj.weight"); !ok {
		t.Error("no blk.2.nextn.eh_proj.weight")
	}
	ti, _ := f.Tensor("token_embd.weight") // 70400 values: the 64Ki block, then its start again
	raw, err := io.ReadAll(f.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	if ti.Type != quant.F16 || len(raw) != 2*64*1100 {
		t.Fatalf("token_embd %s, %d bytes", ti.Type, len(raw))
	}
	got := make([]float32, 64*1100)
	tensor.F16ToF32(got, raw)
	want := Values(3, "token_embd.weight", 1<<16, NormalInit(0, 0.02), 0)
	for _, i := range []int{0, 1, 65535, 65536, 65537, 70399} {
		w := tensor.F16ToFloat32(tensor.Float32ToF16(want[i%(1<<16)]))
		if got[i] != w {
			t.Errorf("value %d: %v, want %v", i, got[i], w)
		}
	}
}
