package quant

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The reference vectors in testdata/vectors were written by ggml's own
// quantize_row_*_ref and dequantize_row_* (llama.cpp 34af94c, built as
// upstream builds ggml-base); testdata/vectors/PROVENANCE.md says how.

const vectorDir = "testdata/vectors"

// vectorRow is the length of each input case: one K-quant super-block,
// eight 32-value blocks.
const vectorRow = 256

// encodeVectorTypes are the types whose encoders are checked against the
// vectors. Every type in vectors/encode must be here, and every type here
// must have an encoder: a missing one fails.
var encodeVectorTypes = []Type{F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K}

// vectorTypes lists the types of the files in vectors/DIR (NAME.ext).
func vectorTypes(t *testing.T, dir, ext string) []Type {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(vectorDir, dir, "*"+ext))
	if err != nil || len(files) == 0 {
		t.Fatalf("no %s vectors in %s: %v", ext, dir, err)
	}
	var out []Type
	for _, f := range files {
		ty, ok := ParseType(strings.TrimSuffix(filepath.Base(f), ext))
		if !ok {
			t.Fatalf("%s: not a ggml type", f)
		}
		out = append(out, ty)
	}
	return out
}

func readVector(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func float32s(b []byte) []float32 {
	f := make([]float32, len(b)/4)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return f
}

// vectorCases is the input rows and their names.
func vectorCases(t *testing.T) ([]string, []float32) {
	t.Helper()
	names := strings.Split(strings.TrimSuffix(string(readVector(t, "cases.txt")), "\n"), "\n")
	in := float32s(readVector(t, "inputs.f32"))
	if len(in) != len(names)*vectorRow {
		t.Fatalf("inputs.f32: %d values for %d cases of %d", len(in), len(names), vectorRow)
	}
	return names, in
}

// finiteFields reports whether every float field of block b (its d, m or
// dmin, or the value of a float type) is finite. ggml_validate_row_data
// refuses any other, so llama-quantize never writes such a block and its
// bytes are not compared.
func finiteFields(ty Type, b []byte) bool {
	for _, f := range ty.Floats() {
		var v float64
		switch f.Kind {
		case Half:
			v = float64(half(b[f.Offset:]))
		case BFloat16:
			v = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[f.Offset:])) << 16))
		default:
			panic("unexpected float kind in a vector type")
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// TestVectorsEncode: Encode reproduces ggml's quantize_row_*_ref (and
// ggml_fp32_to_fp16_row / ggml_fp32_to_bf16_row_ref) byte for byte on every
// case, block by block, except blocks llama-quantize would refuse.
func TestVectorsEncode(t *testing.T) {
	names, in := vectorCases(t)
	for _, ty := range vectorTypes(t, "encode", ".bin") {
		if !slices.Contains(encodeVectorTypes, ty) {
			t.Errorf("vectors/encode/%s.bin: %s is not in encodeVectorTypes", ty, ty)
		}
	}
	for _, ty := range encodeVectorTypes {
		t.Run(ty.String(), func(t *testing.T) {
			if !ty.CanEncode() {
				t.Fatalf("%s has reference vectors but no encoder", ty)
			}
			want := readVector(t, filepath.Join("encode", ty.String()+".bin"))
			rowBytes := int(vectorRow / ty.BlockSize() * ty.TypeSize())
			if len(want) != len(names)*rowBytes {
				t.Fatalf("%d bytes, want %d cases of %d", len(want), len(names), rowBytes)
			}
			got := make([]byte, len(want))
			if err := Encode(ty, got, in); err != nil {
				t.Fatal(err)
			}
			bs := int(ty.TypeSize())
			compared, refused, bad := 0, 0, 0
			for off := 0; off < len(want); off += bs {
				w, g := want[off:off+bs], got[off:off+bs]
				if !finiteFields(ty, w) {
					refused++
					continue
				}
				compared++
				if !bytes.Equal(w, g) {
					if bad++; bad <= 5 {
						c := off / rowBytes
						t.Errorf("case %d %q block %d:\n got %x\nwant %x", c, names[c], off%rowBytes/bs, g, w)
					}
				}
			}
			t.Logf("%d blocks compared, %d refused by llama-quantize", compared, refused)
			if bad > 0 {
				t.Errorf("%d of %d blocks differ", bad, compared)
			}
			if compared == 0 || refused*4 > compared {
				t.Errorf("%d blocks compared, %d with non-finite fields: the vectors test little", compared, refused)
			}
		})
	}
}

// TestVectorsDecode: Decode reproduces ggml's dequantize_row_* (and the
// F16/BF16 row widening) on blocks of random bytes — every scale, minimum
// and quant pattern, Inf and NaN scales included — and, by digest, on the
// reference encoder outputs.
func TestVectorsDecode(t *testing.T) {
	digests := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(readVector(t, "roundtrip.sha256"))), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("roundtrip.sha256: bad line %q", line)
		}
		digests[f[1]] = f[0]
	}
	names, _ := vectorCases(t)
	types := vectorTypes(t, "decode", ".bin")
	if len(types) != len(digests) {
		t.Errorf("%d decode vectors, %d round-trip digests", len(types), len(digests))
	}
	for _, ty := range types {
		t.Run(ty.String(), func(t *testing.T) {
			if !ty.CanDecode() {
				t.Fatalf("%s has reference vectors but no decoder", ty)
			}
			src := readVector(t, filepath.Join("decode", ty.String()+".bin"))
			want := float32s(readVector(t, filepath.Join("decode", ty.String()+".f32")))
			got := make([]float32, len(want))
			if err := Decode(ty, got, src); err != nil {
				t.Fatal(err)
			}
			bad := 0
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					if bad++; bad <= 5 {
						t.Errorf("value %d (block %d): got %g (%#08x), want %g (%#08x)", i, int64(i)/ty.BlockSize(),
							got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d values differ", bad, len(want))
			}

			// decode(reference encoding of every case), NaN made canonical.
			enc := readVector(t, filepath.Join("encode", ty.String()+".bin"))
			rt := make([]float32, len(names)*vectorRow)
			if err := Decode(ty, rt, enc); err != nil {
				t.Fatal(err)
			}
			raw := make([]byte, 4*len(rt))
			for i, v := range rt {
				b := math.Float32bits(v)
				if v != v {
					b = 0x7fc00000
				}
				binary.LittleEndian.PutUint32(raw[4*i:], b)
			}
			sum := sha256.Sum256(raw)
			if h := hex.EncodeToString(sum[:]); h != digests[ty.String()] {
				t.Errorf("decode of encode/%s.bin: sha256 %s, want %s", ty, h, digests[ty.String()])
			}
		})
	}
}
