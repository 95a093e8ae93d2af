package quant_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
)

// testQ8 is a type ggml does not have, made up for TestAddedType: blocks
// of 16 values, a float32 scale d = max|x|/127 and 16 int8 quants
// q = round(x/d); x = q·d. With importance weights w, d is refitted to
// the block's quants by weighted least squares, Σwxq / Σwq².
const testQ8 quant.Type = 63

var testQ8Row = quant.Traits{
	Type: testQ8, Name: "TEST_Q8", BlockSize: 16, TypeSize: 20,
	Floats: []quant.Field{{Name: "d", Offset: 0, Kind: quant.Float32}},
	Encode: func(dst []byte, src []float32) { encodeTestQ8(dst, src, nil) },
	EncodeWeighted: func(dst []byte, src, qw []float32) {
		for b := 0; b*16 < len(src); b++ {
			encodeTestQ8(dst[b*20:], src[b*16:b*16+16], qw[b*16:b*16+16])
		}
	},
	Decode: func(dst []float32, src []byte) {
		for i := range dst {
			b := src[i/16*20:]
			dst[i] = float32(int8(b[4+i%16])) * math.Float32frombits(binary.LittleEndian.Uint32(b))
		}
	},
}

// encodeTestQ8 writes whole blocks of src as testQ8, refitting each
// block's scale with the weights w when there are some.
func encodeTestQ8(dst []byte, src, w []float32) {
	for b := 0; b*16 < len(src); b++ {
		x, out := src[b*16:b*16+16], dst[b*20:b*20+20]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var sxq, sqq float32
		for i, v := range x {
			q := int8(0)
			if d != 0 {
				q = int8(math.Round(float64(v / d)))
			}
			out[4+i] = byte(q)
			if w != nil {
				sxq += w[i] * v * float32(q)
				sqq += w[i] * float32(q) * float32(q)
			}
		}
		if sqq > 0 {
			d = sxq / sqq
		}
		binary.LittleEndian.PutUint32(out, math.Float32bits(d))
	}
}

// TestAddedType: a type is one row. A row registered here, and nowhere
// else, is a ggml type every package takes: llama-quantize's type
// arguments name it, the quantizer plans, encodes (with and without an
// importance matrix), validates and writes it, the GGUF reader sizes it,
// and Decode reads it back. The quantized tensors are the row's encoder's
// bytes, and decode to within a 1% RMS error of the input.
func TestAddedType(t *testing.T) {
	quant.Register(t, testQ8Row)
	tt, err := quantize.NewTensorType("ffn_(up|down)", "test_q8")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := quantize.ParseTensorTypeName("q9_k"); err == nil || !strings.HasSuffix(err.Error(), ", test_q8)") {
		t.Errorf("the types ferry can write do not end with the new one: %v", err)
	}
	m, err := imatrix.Open(filepath.Join("..", "imatrix", "testdata", "qwen35-imatrix.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := gguf.Open(filepath.Join("testdata", "qwen35-base-F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for _, mx := range []*imatrix.Matrix{nil, m} {
		name := "plain"
		if mx != nil {
			name = "imatrix"
		}
		t.Run(name, func(t *testing.T) {
			o := quantize.Options{FileType: quant.FileQ8_0, TensorTypes: []quant.TensorType{tt}, Imatrix: mx}
			p, err := quantize.NewPlan(in, o)
			if err != nil {
				t.Fatal(err)
			}
			planned := 0
			for _, tp := range p.Tensors {
				if tp.Type == testQ8 {
					planned++
				}
			}
			out := filepath.Join(t.TempDir(), "out.gguf")
			if _, err := quantize.Run(context.Background(), in, p, out, quantize.RunOptions{Jobs: 2}); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			written, refitted := 0, 0
			for _, ti := range f.Tensors {
				if !strings.Contains(ti.Name, "ffn_up") && !strings.Contains(ti.Name, "ffn_down") {
					continue
				}
				if ti.Type != testQ8 {
					t.Errorf("%s: written as %s", ti.Name, ti.Type)
					continue
				}
				written++
				src, ok := in.Tensor(ti.Name)
				if !ok {
					t.Fatalf("%s: not in the input", ti.Name)
				}
				var w []float32 // nil for the tensors the matrix lacks (the MTP block's)
				if mx != nil {
					if w, err = mx.Weights(ti.Name, src.Dims); err != nil {
						t.Fatal(err)
					}
				}
				got, err := io.ReadAll(f.Section(ti))
				if err != nil {
					t.Fatal(err)
				}
				if want := requantized(t, in, src, testQ8, w); !bytes.Equal(got, want) {
					t.Errorf("%s: the quantizer's bytes are not the row's encoder's", ti.Name)
				}
				if w != nil && !bytes.Equal(got, requantized(t, in, src, testQ8, nil)) {
					refitted++
				}
				orig := make([]float32, src.NumElements())
				back := make([]float32, ti.NumElements())
				raw, err := io.ReadAll(in.Section(src))
				if err != nil {
					t.Fatal(err)
				}
				if err := quant.Decode(src.Type, orig, raw); err != nil {
					t.Fatal(err)
				}
				if err := quant.Decode(testQ8, back, got); err != nil {
					t.Fatal(err)
				}
				var sq, errSq float64
				for i, x := range orig {
					sq += float64(x) * float64(x)
					errSq += (float64(back[i]) - float64(x)) * (float64(back[i]) - float64(x))
				}
				if rel := math.Sqrt(errSq / sq); !(rel < 0.01) {
					t.Errorf("%s: round trip RMS error %.3g of the values' RMS", ti.Name, rel)
				}
			}
			if written == 0 || written != planned {
				t.Errorf("%d tensors written as %s, %d planned", written, testQ8, planned)
			}
			if mx != nil && refitted == 0 {
				t.Error("no tensor's bytes changed with the importance matrix: the weighted encoder was not used")
			}
		})
	}
}
