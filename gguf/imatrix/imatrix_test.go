package imatrix

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// quantDir holds the llama-quantize goldens made with these matrices.
var quantDir = filepath.Join("..", "quant", "testdata")

// refLoaded is llama-quantize's summary line of the matrix it loaded.
var refLoaded = regexp.MustCompile(`load_imatrix: loaded (\d+) importance matrix entries from (\S+) computed on (\d+) chunks`)

// quantizeLog reads the llama-quantize log of MODEL's imatrix TYPE run.
func quantizeLog(t *testing.T, model, typ string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(quantDir, "logs", model+"-quantize_imatrix_"+typ+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func open(t *testing.T, path string) *Matrix {
	t.Helper()
	m, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReference reads both reference matrices in both formats: the entry
// and chunk counts llama-quantize logged, the dataset, and for every entry
// the same vector, bit for bit, from the GGUF sums and counts and from the
// .dat values (the .dat stores (sum/count)·64 and its reader divides by 64
// again, which is exact for a power of two).
func TestReference(t *testing.T) {
	for _, model := range []string{"qwen3", "qwen35"} {
		t.Run(model, func(t *testing.T) {
			g := open(t, filepath.Join("testdata", model+"-imatrix.gguf"))
			d := open(t, filepath.Join("testdata", model+"-imatrix.dat"))
			logged := refLoaded.FindStringSubmatch(quantizeLog(t, model, "Q4_K_M"))
			if logged == nil || logged[2] != "imatrix.gguf" {
				t.Fatalf("no load_imatrix line in the log: %q", logged)
			}
			entries, _ := strconv.Atoi(logged[1])
			chunks, _ := strconv.Atoi(logged[3])
			for _, m := range []*Matrix{g, d} {
				if m.Len() != entries || m.Chunks() != chunks || !slices.Equal(m.Datasets(), []string{"calib.txt"}) {
					t.Errorf("%s (%s): %d entries, %d chunks, datasets %q; llama-quantize loaded %d entries, %d chunks, calib.txt",
						m.Path(), m.Format(), m.Len(), m.Chunks(), m.Datasets(), entries, chunks)
				}
			}
			if g.Format() != GGUF || d.Format() != Legacy || g.ChunkSize() != 128 || d.ChunkSize() != 0 {
				t.Errorf("formats %s, %s; chunk sizes %d, %d", g.Format(), d.Format(), g.ChunkSize(), d.ChunkSize())
			}
			if !slices.Equal(g.Entries(), d.Entries()) {
				t.Fatalf("entries differ:\ngguf %q\ndat  %q", g.Entries(), d.Entries())
			}
			for _, name := range g.Entries() {
				gv, _ := g.Lookup(name)
				dv, ok := d.Lookup(name)
				if !ok || len(gv) != len(dv) || len(gv) == 0 {
					t.Fatalf("%s: %d values from the GGUF, %d from the .dat", name, len(gv), len(dv))
				}
				for i := range gv {
					if math.Float32bits(gv[i]) != math.Float32bits(dv[i]) || !(gv[i] > 0) {
						t.Fatalf("%s[%d]: %g from the GGUF, %g from the .dat", name, i, gv[i], dv[i])
					}
				}
			}
		})
	}
}

// TestReferenceValues recomputes one reference entry from the GGUF file's
// raw tensors with package gguf: in_sum2 / counts.
func TestReferenceValues(t *testing.T) {
	path := filepath.Join("testdata", "qwen3-imatrix.gguf")
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw := func(name string) []float32 {
		ti, ok := f.Tensor(name)
		if !ok || ti.Type != quant.F32 {
			t.Fatalf("%s: no F32 tensor %s", path, name)
		}
		b := make([]byte, ti.Size())
		if _, err := f.Section(ti).ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return v
	}
	sums, counts := raw("blk.1.ffn_down.weight.in_sum2"), raw("blk.1.ffn_down.weight.counts")
	if len(sums) != 512 || !slices.Equal(counts, []float32{8192}) {
		t.Fatalf("%d sums, counts %v", len(sums), counts)
	}
	v, _ := open(t, path).Lookup("blk.1.ffn_down.weight")
	for i, s := range sums {
		if v[i] != s/8192 {
			t.Fatalf("value %d: %g, want %g / 8192", i, v[i], s)
		}
	}
}

// quantized lists the tensors a golden quantized (all but the F32 ones,
// which llama-quantize copies without looking for weights), with dims.
func quantized(t *testing.T, model, typ string) map[string][]uint64 {
	t.Helper()
	g, err := goldenfile.Load(filepath.Join(quantDir, "golden", model+"-imatrix-"+typ+".json"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]uint64{}
	for _, ti := range g.Tensors {
		if ti.Type != "F32" {
			out[ti.Name] = ti.Dims
		}
	}
	return out
}

// TestMissing checks Missing and Weights against what llama-quantize did
// with these matrices: the tensors it logged "did not find weights for"
// are exactly Missing's (token_embd, qwen35's output.weight and its whole
// MTP block, blk.4, which llama-imatrix never runs), and every other
// quantized tensor has a vector of its row length.
func TestMissing(t *testing.T) {
	notFound := regexp.MustCompile(`did not find weights for (\S+)`)
	for _, model := range []string{"qwen3", "qwen35"} {
		tensors := quantized(t, model, "Q4_K_M")
		var want []string
		for _, m := range notFound.FindAllStringSubmatch(quantizeLog(t, model, "Q4_K_M"), -1) {
			want = append(want, m[1])
		}
		slices.Sort(want)
		if len(want) == 0 {
			t.Fatalf("%s: no 'did not find weights' lines in the log", model)
		}
		if model == "qwen35" && !slices.Contains(want, "blk.4.nextn.eh_proj.weight") {
			t.Errorf("qwen35: the log does not name the MTP eh_proj: %q", want)
		}
		names := make([]string, 0, len(tensors))
		for n := range tensors {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, ext := range []string{".gguf", ".dat"} {
			m := open(t, filepath.Join("testdata", model+"-imatrix"+ext))
			if got := m.Missing(names); !slices.Equal(got, want) {
				t.Errorf("%s%s: Missing = %q, llama-quantize found no weights for %q", model, ext, got, want)
			}
			for _, n := range names {
				v, err := m.Weights(n, tensors[n])
				if err != nil || (v == nil) != slices.Contains(want, n) || (v != nil && uint64(len(v)) != tensors[n][0]) {
					t.Errorf("%s%s: Weights(%s, %v) = %d values, %v", model, ext, n, tensors[n], len(v), err)
				}
			}
		}
	}
}

// TestKVs compares KVs with the quantize.imatrix.* keys of every
// llama-quantize golden made with these matrices (its command named the
// matrix "imatrix.gguf"). The .dat matrix gives the same keys but for the
// file name, which is whatever the command line said.
func TestKVs(t *testing.T) {
	for _, c := range []struct{ model, typ string }{
		{"qwen3", "Q2_K"}, {"qwen3", "Q3_K_M"}, {"qwen3", "Q4_K_M"}, {"qwen3", "Q5_K_S"}, {"qwen3", "Q6_K"},
		{"qwen35", "Q2_K"}, {"qwen35", "Q4_K_M"},
	} {
		g, err := goldenfile.Load(filepath.Join(quantDir, "golden", c.model+"-imatrix-"+c.typ+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var want []goldenfile.KV
		for _, kv := range g.KVs {
			if strings.HasPrefix(kv.Key, "quantize.imatrix.") {
				want = append(want, kv)
			}
		}
		if len(want) != 4 || !strings.Contains(quantizeLog(t, c.model, c.typ), "--imatrix imatrix.gguf ") {
			t.Fatalf("%s %s: %d quantize.imatrix keys", c.model, c.typ, len(want))
		}
		for _, ext := range []string{".gguf", ".dat"} {
			m := open(t, filepath.Join("testdata", c.model+"-imatrix"+ext))
			got := m.KVs("imatrix.gguf")
			if len(got) != len(want) {
				t.Fatalf("%s %s%s: %d KVs, want %d", c.model, c.typ, ext, len(got), len(want))
			}
			for i, kv := range got {
				v, _ := json.Marshal(kv.Value)
				if kv.Key != want[i].Key || kv.Type.String() != want[i].Type || !bytes.Equal(v, want[i].Value) {
					t.Errorf("%s %s%s: KV %d is %s %s %s, llama-quantize wrote %s %s %s", c.model, c.typ, ext, i, kv.Key, kv.Type, v, want[i].Key, want[i].Type, want[i].Value)
				}
			}
		}
	}
}
