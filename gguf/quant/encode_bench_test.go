package quant_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// BenchmarkEncode measures each block quantizer on 256 KiB of float32
// weights drawn like a trained layer's (normal, σ 0.02): MB/s of float32
// input and ns per block.
func BenchmarkEncode(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]float32, 64*1024)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
	}
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K} {
		b.Run(typ.String(), func(b *testing.B) {
			blocks := int64(len(src)) / typ.BlockSize()
			dst := make([]byte, blocks*typ.TypeSize())
			b.SetBytes(int64(4 * len(src)))
			b.ReportAllocs()
			for b.Loop() {
				if err := quant.Encode(typ, dst, src); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*blocks), "ns/block")
		})
	}
}
