package mlxpack

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ferry-llm/ferry/tensor"
)

// BenchmarkAffineQuantize times AffineQuantize on one core: a [1024, 4096]
// matrix of bfloat16 weights (N(0, 0.02)), scales and biases stored as
// BF16. MB/s counts the BF16 input (2 bytes a weight), the bytes a
// checkpoint holds; `make bench` runs one pass of each.
func BenchmarkAffineQuantize(b *testing.B) {
	const rows, cols = 1024, 4096
	rng := rand.New(rand.NewPCG(1, 2))
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = tensor.RoundTo(tensor.BF16, float32(rng.NormFloat64()*0.02))
	}
	for _, c := range []struct{ bits, group int }{{4, 64}, {8, 64}, {3, 64}, {6, 64}, {4, 32}, {4, 128}} {
		b.Run(fmt.Sprintf("b%d_g%d", c.bits, c.group), func(b *testing.B) {
			wq := make([]byte, len(w)*c.bits/8)
			sc := make([]byte, len(w)/c.group*2)
			bi := make([]byte, len(sc))
			b.SetBytes(int64(len(w)) * 2)
			b.ReportAllocs()
			for b.Loop() {
				if err := AffineQuantize(w, cols, c.group, c.bits, tensor.BF16, wq, sc, bi); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
