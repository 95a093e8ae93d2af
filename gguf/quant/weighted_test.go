package quant_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// TestGoldenImatrixTensors re-makes every tensor llama-quantize quantized
// in the imatrix goldens (ImatrixGoldens) from the kept F16 input and the
// matrix it was given: Decode of the input, the tensor's importance vector
// as imatrix.Weights chooses it (none for the tensors the matrix lacks:
// token_embd, output, qwen35's MTP block), EncodeWeighted as the output's
// type; each sha256 must be the dump's. Tensors llama-quantize quantized
// with weights are counted apart from those without.
//
// With -short (make qemu's run under emulation, where the full set takes
// some 20 s of CPU) it re-makes, per model, at most shortPerKind distinct
// tensors of each type with weights and as many without, of at most
// shortMaxValues values each.
func TestGoldenImatrixTensors(t *testing.T) {
	const shortPerKind, shortMaxValues = 2, 65536
	type kind struct {
		typ      quant.Type
		weighted bool
	}
	weighted, plain := map[quant.Type]int{}, map[quant.Type]int{}
	for _, model := range slices.Sorted(func(yield func(string) bool) {
		for m := range ImatrixGoldens {
			if !yield(m) {
				return
			}
		}
	}) {
		t.Run(model, func(t *testing.T) {
			in, err := gguf.Open(filepath.Join("testdata", model+"-base-F16.gguf"))
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			m, err := imatrix.Open(filepath.Join("..", "imatrix", "testdata", model+"-imatrix.gguf"))
			if err != nil {
				t.Fatal(err)
			}
			sums := map[string]string{} // name/type → our sha256
			made := map[kind]int{}
			for _, typ := range ImatrixGoldens[model] {
				path := filepath.Join("testdata", "golden", model+"-imatrix-"+typ+".json")
				for _, q := range quantizedTensors(t, in, path) {
					gt, ti, out := q.golden, q.input, q.out
					w, err := m.Weights(ti.Name, ti.Dims)
					if err != nil {
						t.Fatalf("%s: %v", path, err)
					}
					key := gt.Name + "/" + gt.Type
					sum, ok := sums[key]
					if !ok {
						k := kind{out, w != nil}
						if testing.Short() && (made[k] == shortPerKind || ti.NumElements() > shortMaxValues) {
							continue
						}
						made[k]++
						sum = requantize(t, in, ti, out, w)
						sums[key] = sum
					}
					if w != nil {
						weighted[out]++
					} else {
						plain[out]++
					}
					if sum != gt.SHA256 {
						t.Errorf("%s: %s as %s (weights: %t): sha256 %s, llama-quantize wrote %s", filepath.Base(path), gt.Name, out, w != nil, sum, gt.SHA256)
					}
				}
			}
			t.Logf("%d distinct encodings", len(sums))
		})
	}
	t.Logf("tensors checked per type, with importance weights: %v; without: %v", weighted, plain)
	for _, ty := range []quant.Type{quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K} {
		if weighted[ty] == 0 {
			t.Errorf("no %s tensor checked with weights", ty)
		}
	}
}

// BenchmarkEncodeWeighted measures each importance-weighted quantizer on
// 256 KiB of float32 weights drawn like a trained layer's (normal, σ 0.02)
// in rows of 4096, with importance weights spread like an imatrix's
// (log-normal over some six decades): MB/s of float32 input and ns per
// block.
func BenchmarkEncodeWeighted(b *testing.B) {
	const rowLen = 4096
	rng := rand.New(rand.NewPCG(1, 2))
	src := layerWeights(rng)
	weights := make([]float32, rowLen)
	for i := range weights {
		weights[i] = float32(math.Exp(2.5 * rng.NormFloat64()))
	}
	benchTypes(b, src, []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
		quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K},
		func(typ quant.Type, dst []byte) error { return quant.EncodeWeighted(typ, dst, src, rowLen, weights) })
}

// TestEncodeWeightedArgs: rows that are not whole blocks, values that are
// not whole rows, a weight vector of another length, a short dst and a type
// without an encoder are errors; nil weights are Encode, and the types
// ggml quantizes without looking at the weights (Q8_0, F16, BF16, F32)
// give Encode's bytes whatever the weights.
func TestEncodeWeightedArgs(t *testing.T) {
	src := make([]float32, 1024)
	for i := range src {
		src[i] = float32(math.Sin(float64(i))) * float32(1+i%7)
	}
	ones := make([]float32, 512)
	for i := range ones {
		ones[i] = float32(1 + i%5)
	}
	bad := []struct {
		name    string
		typ     quant.Type
		dst     int
		n       int
		rowLen  int
		weights []float32
	}{
		{"row not whole blocks", quant.Q4_K, 576, 1024, 128, ones[:128]},
		{"values not whole rows", quant.Q4_K, 576, 1024, 768, ones[:256]},
		{"zero row length", quant.Q4_K, 576, 1024, 0, ones[:256]},
		{"weights of another length", quant.Q4_K, 576, 1024, 512, ones[:256]},
		{"short dst", quant.Q4_K, 575, 1024, 512, ones},
		{"no encoder", quant.IQ2_XS, 1024, 1024, 512, ones},
		{"legacy row not whole blocks", quant.Q4_0, 540, 960, 48, ones[:48]},
	}
	for _, c := range bad {
		err := quant.EncodeWeighted(c.typ, make([]byte, c.dst), src[:c.n], c.rowLen, c.weights)
		if err == nil {
			t.Errorf("%s: no error", c.name)
		}
		t.Logf("%s: %v", c.name, err)
	}
	for _, typ := range []quant.Type{quant.Q8_0, quant.F16, quant.BF16, quant.F32, quant.Q4_0, quant.Q5_1, quant.Q2_K, quant.Q6_K} {
		n, _ := typ.RowSize(uint64(len(src)))
		want := make([]byte, n)
		if err := quant.Encode(typ, want, src); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := quant.EncodeWeighted(typ, got, src, 512, nil); err != nil {
			t.Fatalf("%s, nil weights: %v", typ, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: nil weights do not give Encode's bytes", typ)
		}
		if err := quant.EncodeWeighted(typ, got, src, 512, ones); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		ignores := typ == quant.Q8_0 || typ == quant.F16 || typ == quant.BF16 || typ == quant.F32
		if bytes.Equal(got, want) != ignores {
			t.Errorf("%s: with weights, the same bytes as Encode: %t, want %t", typ, !ignores, ignores)
		}
	}
}
