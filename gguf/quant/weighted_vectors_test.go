package quant

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
)

// weightedVectorTypes are the types with an importance-weighted encoder,
// each with a file in testdata/vectors/weighted: ggml's quantize_TYPE (the
// _impl paths) on the vector cases with the weights in weights.f32.
var weightedVectorTypes = []Type{Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K}

// TestVectorsWeighted: EncodeWeighted reproduces ggml's weighted paths byte
// for byte, except blocks llama-quantize would refuse, on three matrices:
// every case as a row of 256 under importance-matrix-like weights (w0),
// then under sparse weights (w1: a third zero, some 1e-30 and 1e6, a whole
// 16- and a whole 32-value group zero), then the first cases, four at a
// time, as rows of 1024 (w2: legacy types take σ² over the whole row).
func TestVectorsWeighted(t *testing.T) {
	names, in := vectorCases(t)
	w := float32s(readVector(t, filepath.Join("weighted", "weights.f32")))
	if len(w) != 256+256+1024 {
		t.Fatalf("weights.f32: %d values", len(w))
	}
	long := len(names) / 4
	matrices := []struct {
		name    string
		src     []float32
		row     int
		weights []float32
	}{
		{"w0", in, 256, w[:256]},
		{"w1", in, 256, w[256:512]},
		{"w2", in[:long*1024], 1024, w[512:]},
	}
	for _, ty := range weightedVectorTypes {
		t.Run(ty.String(), func(t *testing.T) {
			want := readVector(t, filepath.Join("weighted", ty.String()+".bin"))
			bs := int(ty.TypeSize())
			compared, refused, bad := 0, 0, 0
			off := 0
			for _, m := range matrices {
				n := len(m.src) / int(ty.BlockSize()) * bs
				if off+n > len(want) {
					t.Fatalf("%d bytes, matrix %s ends at %d", len(want), m.name, off+n)
				}
				got := make([]byte, n)
				if err := EncodeWeighted(ty, got, m.src, m.row, m.weights); err != nil {
					t.Fatal(err)
				}
				rowBytes := m.row / int(ty.BlockSize()) * bs
				for b := 0; b < n; b += bs {
					wb, gb := want[off+b:off+b+bs], got[b:b+bs]
					if !finiteFields(ty, wb) {
						refused++
						continue
					}
					compared++
					if !bytes.Equal(wb, gb) {
						if bad++; bad <= 5 {
							r := b / rowBytes
							what := fmt.Sprintf("case %d %q", r, names[r])
							if m.row != 256 {
								what = fmt.Sprintf("cases %d-%d", 4*r, 4*r+3)
							}
							t.Errorf("%s, %s block %d:\n got %x\nwant %x", m.name, what, b%rowBytes/bs, gb, wb)
						}
					}
				}
				off += n
			}
			if off != len(want) {
				t.Errorf("%d bytes, the matrices make %d", len(want), off)
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
