package quant_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// TestGoldenTensors re-makes, from the kept F16 inputs, every tensor that
// llama-quantize wrote in another type in the golden outputs of those
// inputs, with Decode (the input's type) and Encode (the output's type),
// and compares the sha256 of its bytes with the dump's. It checks the
// block encoders on real weights whatever type rules chose the types.
// Types without an encoder are counted and listed, not checked.
//
// With -short (make qemu's run under emulation, some 40 times slower) it
// re-makes at most shortPerType distinct tensors of each type per model.
func TestGoldenTensors(t *testing.T) {
	const shortPerType = 2
	checked, missing := map[quant.Type]int{}, map[quant.Type]int{}
	for _, model := range []string{"qwen3", "qwen35"} {
		t.Run(model, func(t *testing.T) {
			in, err := gguf.Open(filepath.Join("testdata", model+"-base-F16.gguf"))
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			dumps, err := filepath.Glob(filepath.Join("testdata", "golden", model+"-base-*.json"))
			if err != nil {
				t.Fatal(err)
			}
			legacy, err := filepath.Glob(filepath.Join("testdata", "golden", "families", model+"-Q*.json"))
			if err != nil {
				t.Fatal(err)
			}
			sums := map[string]string{} // name/type → our sha256
			made := map[quant.Type]int{}
			for _, path := range append(dumps, legacy...) {
				for _, q := range quantizedTensors(t, in, path) {
					gt, ti, out := q.golden, q.input, q.out
					if !out.CanEncode() {
						missing[out]++
						continue
					}
					key := gt.Name + "/" + gt.Type
					sum, ok := sums[key]
					if !ok {
						if testing.Short() && made[out] == shortPerType {
							continue
						}
						made[out]++
						sum = requantize(t, in, ti, out, nil)
						sums[key] = sum
					}
					checked[out]++
					if sum != gt.SHA256 {
						t.Errorf("%s: %s as %s: sha256 %s, llama-quantize wrote %s%s", filepath.Base(path), gt.Name, out, sum, gt.SHA256,
							firstDiff(requantized(t, in, ti, out, nil), referenceFor(path), gt.Name, out))
					}
				}
			}
			t.Logf("%d distinct encodings", len(sums))
		})
	}
	t.Logf("tensors checked per type: %v; no encoder yet: %v", checked, missing)
	for _, ty := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
		quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K} {
		if checked[ty] == 0 {
			t.Errorf("no %s tensor checked", ty)
		}
	}
}

// quantizedTensor is a tensor of a golden dump that llama-quantize made
// in another type than its input's: the dump's entry, the input tensor and
// the output type.
type quantizedTensor struct {
	golden goldenfile.Tensor
	input  gguf.TensorInfo
	out    quant.Type
}

// quantizedTensors lists, in the dump's order, the tensors of the golden
// dump at path that were quantized from in rather than copied.
func quantizedTensors(t *testing.T, in *gguf.File, path string) []quantizedTensor {
	t.Helper()
	g, err := goldenfile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var qs []quantizedTensor
	for _, gt := range g.Tensors {
		out, ok := quant.ParseType(gt.Type)
		if !ok {
			t.Fatalf("%s: %s: type %s", path, gt.Name, gt.Type)
		}
		ti, ok := in.Tensor(gt.Name)
		if !ok {
			t.Fatalf("%s: tensor %s is not in the input", path, gt.Name)
		}
		if ti.Type != out {
			qs = append(qs, quantizedTensor{gt, ti, out})
		}
	}
	return qs
}

// requantize is the sha256 of requantized(t, in, ti, out, weights).
func requantize(t *testing.T, in *gguf.File, ti gguf.TensorInfo, out quant.Type, weights []float32) string {
	t.Helper()
	sum := sha256.Sum256(requantized(t, in, ti, out, weights))
	return hex.EncodeToString(sum[:])
}

// referenceFor is the reference GGUF a golden dump (testdata/golden/
// MODEL-NAME.json) was made from, ../shared/reference/MODEL/gguf/NAME.gguf
// beside the clone: present on the machines that made the goldens.
func referenceFor(dump string) string {
	model, name, _ := strings.Cut(strings.TrimSuffix(filepath.Base(dump), ".json"), "-")
	return filepath.Join("..", "..", "..", "shared", "reference", model, "gguf", name+".gguf")
}

// firstDiff names the first block where got differs from tensor name of
// the reference GGUF at ref, when that file is there; otherwise nothing
// (the test needs only testdata).
func firstDiff(got []byte, ref, name string, typ quant.Type) string {
	f, err := gguf.Open(ref)
	if err != nil {
		return ""
	}
	defer f.Close()
	ti, ok := f.Tensor(name)
	if !ok {
		return ""
	}
	want, err := io.ReadAll(f.Section(ti))
	if err != nil {
		return fmt.Sprintf(" (%s: %v)", ref, err)
	}
	bs := int(typ.TypeSize())
	for b := 0; (b+1)*bs <= min(len(got), len(want)); b++ {
		if g, w := got[b*bs:(b+1)*bs], want[b*bs:(b+1)*bs]; !bytes.Equal(g, w) {
			return fmt.Sprintf("; first differing block %d of %d (%s):\n got  %x\n want %x", b, len(want)/bs, ref, g, w)
		}
	}
	return fmt.Sprintf("; %d bytes, %s has %d", len(got), ref, len(want))
}

// requantized is tensor ti of in decoded and encoded as out, with
// llama-quantize's importance vector for it (nil: none): the weights of
// matrix i2 (an expert) are weights[i2·ne0 : (i2+1)·ne0].
func requantized(t *testing.T, in *gguf.File, ti gguf.TensorInfo, out quant.Type, weights []float32) []byte {
	t.Helper()
	raw, err := io.ReadAll(in.Section(ti))
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float32, ti.NumElements())
	if err := quant.Decode(ti.Type, vals, raw); err != nil {
		t.Fatalf("%s: %v", ti.Name, err)
	}
	n, ok := out.RowSize(ti.NumElements())
	if !ok {
		t.Fatalf("%s: %d values are not whole %s blocks", ti.Name, ti.NumElements(), out)
	}
	dst := make([]byte, n)
	rowLen := int(ti.Dims[0])
	matrices := max(1, len(weights)/rowLen)
	vn, dn := len(vals)/matrices, len(dst)/matrices
	for i := range matrices {
		var w []float32
		if weights != nil {
			w = weights[i*rowLen : (i+1)*rowLen]
		}
		if err := quant.EncodeWeighted(out, dst[i*dn:(i+1)*dn], vals[i*vn:(i+1)*vn], rowLen, w); err != nil {
			t.Fatalf("%s: %v", ti.Name, err)
		}
	}
	return dst
}
