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
	src := layerWeights(rand.New(rand.NewPCG(1, 2)))
	benchTypes(b, src, []quant.Type{quant.Q8_0, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K},
		func(typ quant.Type, dst []byte) error { return quant.Encode(typ, dst, src) })
}

// layerWeights is 64 Ki float32 weights drawn from rng like a trained
// layer's (normal, σ 0.02).
func layerWeights(rng *rand.Rand) []float32 {
	src := make([]float32, 64*1024)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
	}
	return src
}

// benchTypes runs encode, which writes the n values of src as its type
// into dst, as a sub-benchmark of each type: MB/s of float32 input and ns
// per block.
func benchTypes(b *testing.B, src []float32, types []quant.Type, encode func(typ quant.Type, dst []byte) error) {
	for _, typ := range types {
		b.Run(typ.String(), func(b *testing.B) {
			blocks := int64(len(src)) / typ.BlockSize()
			dst := make([]byte, blocks*typ.TypeSize())
			b.SetBytes(int64(4 * len(src)))
			b.ReportAllocs()
			for b.Loop() {
				if err := encode(typ, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(int64(b.N)*blocks), "ns/block")
		})
	}
}

// BenchmarkDecode measures each block decoder (what the quality report
// and verification dequantize with) on the encoding of the same weights:
// MB/s of float32 output.
func BenchmarkDecode(b *testing.B) {
	src := layerWeights(rand.New(rand.NewPCG(1, 2)))
	out := make([]float32, len(src))
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K} {
		enc := make([]byte, int64(len(src))/typ.BlockSize()*typ.TypeSize())
		if err := quant.Encode(typ, enc, src); err != nil {
			b.Fatal(err)
		}
		b.Run(typ.String(), func(b *testing.B) {
			b.SetBytes(int64(4 * len(out)))
			for b.Loop() {
				if err := quant.Decode(typ, out, enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOneBlock measures Encode and Decode of a single block, where
// what a call costs besides the block (finding the type's row, checking
// the sizes) weighs most: F32's block is one value, so its time is nearly
// all call. ns per call.
func BenchmarkOneBlock(b *testing.B) {
	src := layerWeights(rand.New(rand.NewPCG(1, 2)))
	for _, typ := range []quant.Type{quant.F32, quant.Q8_0, quant.Q4_K} {
		x := src[:typ.BlockSize()]
		enc := make([]byte, typ.TypeSize())
		out := make([]float32, len(x))
		b.Run("Encode/"+typ.String(), func(b *testing.B) {
			for b.Loop() {
				if err := quant.Encode(typ, enc, x); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Decode/"+typ.String(), func(b *testing.B) {
			for b.Loop() {
				if err := quant.Decode(typ, out, enc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
