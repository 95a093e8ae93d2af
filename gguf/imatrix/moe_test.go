package imatrix

import (
	"encoding/binary"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// rawDat is one entry of a .dat file as stored: ncall and the values
// before load_imatrix divides them.
type rawDat struct {
	ncall  int32
	values []float32
}

// readRawDat parses a well-formed .dat file's entries (the reference
// files), independently of readLegacy.
func readRawDat(t *testing.T, path string) map[string]rawDat {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	out := map[string]rawDat{}
	n, p := int(le.Uint32(b)), 4
	for range n {
		ln := int(le.Uint32(b[p:]))
		name := string(b[p+4 : p+4+ln])
		p += 4 + ln
		e := rawDat{ncall: int32(le.Uint32(b[p:]))}
		nval := int(le.Uint32(b[p+4:]))
		p += 8
		for i := range nval {
			e.values = append(e.values, math.Float32frombits(le.Uint32(b[p+4*i:])))
		}
		p += 4 * nval
		out[name] = e
	}
	return out
}

// rawGGUF reads the F32 tensor name of f.
func rawGGUF(t *testing.T, f *gguf.File, name string) []float32 {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok || ti.Type != quant.F32 {
		t.Fatalf("%s: no F32 tensor %s", f.Path, name)
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

// TestReferenceMoE reads the two matrices of one llama-imatrix run on a
// Qwen3.5-MoE model (testdata/qwen35moe-imatrix.*, and qwen35moe32-imatrix.*
// of a 32-expert model on 48 tokens, where some experts saw no token; see
// PROVENANCE.md), whose expert tensors have one token count per expert,
// and checks the legacy arithmetic end to end against the GGUF file's raw
// sums and counts:
//
//   - llama-imatrix's legacy writer: ncall = ⌈max_e count_e / chunk_size⌉
//     and each value fl(fl(in_sum2 / count_e) · ncall), or ncall itself for
//     an expert that saw no token (value and count taken as 1);
//   - load_imatrix's legacy branch (Lookup of the .dat): fl(value / ncall),
//     so exactly 1 for an expert that saw no token;
//   - its GGUF branch (Lookup of the .gguf): fl(in_sum2 / count_e), or 1
//     for an expert whose count is 0.
//
// The round trip · ncall / ncall is exact when ncall is a power of two
// (every dense entry of the first model: 8192 tokens, ncall 64), not
// otherwise: the expert entries' vectors differ between the formats in
// some elements, and so do llama-quantize's expert tensors made from each
// (gguf/quantize's TestGoldenMoEImatrix and TestGoldenMoEZeroCount have
// both).
func TestReferenceMoE(t *testing.T) {
	for _, c := range []struct {
		name, log string
		zeros     int // experts (of all expert entries) that saw no token
	}{
		{"qwen35moe-imatrix", filepath.Join("..", "quantize", "testdata", "logs", "quantize_imatrix_dat_Q4_K_M.log"), 0},
		// Expert 2 of blk.0's three expert tensors, 6 and 22 of blk.1's.
		{"qwen35moe32-imatrix", filepath.Join("..", "quantize", "testdata", "logs", "qwen35moe32", "quantize_imatrix_dat_Q4_K_M.log"), 9},
	} {
		t.Run(c.name, func(t *testing.T) { referenceMoE(t, c.name, c.log, c.zeros) })
	}
}

func referenceMoE(t *testing.T, base, logPath string, wantZeros int) {
	gPath := filepath.Join("testdata", base+".gguf")
	dPath := filepath.Join("testdata", base+".dat")
	g, d := open(t, gPath), open(t, dPath)
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	logged := refLoaded.FindStringSubmatch(string(b))
	if logged == nil || logged[2] != "imatrix.dat" {
		t.Fatalf("no load_imatrix line for imatrix.dat in the log: %q", logged)
	}
	entries, _ := strconv.Atoi(logged[1])
	chunks, _ := strconv.Atoi(logged[3])
	for _, m := range []*Matrix{g, d} {
		if m.Len() != entries || m.Chunks() != chunks || !slices.Equal(m.Datasets(), []string{"calib.txt"}) {
			t.Errorf("%s: %d entries, %d chunks, datasets %q; llama-quantize loaded %d entries, %d chunks, calib.txt",
				m.Path(), m.Len(), m.Chunks(), m.Datasets(), entries, chunks)
		}
	}
	if !slices.Equal(g.Entries(), d.Entries()) {
		t.Fatalf("entries differ:\ngguf %q\ndat  %q", g.Entries(), d.Entries())
	}
	f, err := gguf.Open(gPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw := readRawDat(t, dPath)
	chunkSize := int64(g.ChunkSize())
	experts, differing, zeros, ones := 0, 0, 0, 0
	for _, name := range g.Entries() {
		sums := rawGGUF(t, f, name+sumsSuffix)
		counts := rawGGUF(t, f, name+countsSuffix)
		r := raw[name]
		gv, _ := g.Lookup(name)
		dv, _ := d.Lookup(name)
		if len(r.values) != len(sums) || len(gv) != len(sums) || len(dv) != len(sums) || len(sums)%len(counts) != 0 {
			t.Fatalf("%s: %d sums, %d counts, %d .dat values; loaded %d and %d", name, len(sums), len(counts), len(r.values), len(gv), len(dv))
		}
		maxCount := int64(0)
		for _, c := range counts {
			maxCount = max(maxCount, int64(c))
		}
		if want := (maxCount + chunkSize - 1) / chunkSize; int64(r.ncall) != want {
			t.Errorf("%s: ncall %d, want ⌈%d / %d⌉ = %d", name, r.ncall, maxCount, chunkSize, want)
		}
		if len(counts) > 1 {
			experts++
			if !strings.Contains(name, "_exps.") {
				t.Errorf("%s: %d counts", name, len(counts))
			}
		}
		ne0 := len(sums) / len(counts)
		for e, c := range counts {
			if c != 0 {
				continue
			}
			zeros++
			if !slices.ContainsFunc(gv[e*ne0:(e+1)*ne0], func(f float32) bool { return f != 1 }) &&
				!slices.ContainsFunc(dv[e*ne0:(e+1)*ne0], func(f float32) bool { return f != 1 }) {
				ones++
			}
		}
		n := float32(r.ncall)
		diff := 0
		for i, s := range sums {
			c := counts[i/ne0]
			wantRaw, wantG := float32(1)*n, float32(1)
			if c != 0 {
				wantG = s / c
				wantRaw = wantG * n
			}
			if math.Float32bits(r.values[i]) != math.Float32bits(wantRaw) {
				t.Fatalf("%s[%d]: .dat holds %g, want (%g / %g) · %g = %g", name, i, r.values[i], s, c, n, wantRaw)
			}
			if math.Float32bits(gv[i]) != math.Float32bits(wantG) {
				t.Fatalf("%s[%d]: %g from the GGUF, want %g / %g = %g", name, i, gv[i], s, c, wantG)
			}
			if want := r.values[i] / n; math.Float32bits(dv[i]) != math.Float32bits(want) {
				t.Fatalf("%s[%d]: %g from the .dat, want %g / %g = %g", name, i, dv[i], r.values[i], n, want)
			}
			if dv[i] != gv[i] {
				diff++
			}
		}
		if bits.OnesCount32(uint32(r.ncall)) == 1 && diff != 0 {
			t.Errorf("%s: ncall %d is a power of two, yet %d values differ between the formats", name, r.ncall, diff)
		}
		if diff > 0 {
			differing++
			t.Logf("%s: ncall %d, counts %v: %d of %d values differ between the formats", name, r.ncall, counts, diff, len(sums))
		}
	}
	if experts == 0 || differing == 0 {
		t.Errorf("%d expert entries, %d entries whose formats differ; the reference should have both", experts, differing)
	}
	if zeros != wantZeros || ones != zeros {
		t.Errorf("%d experts with count 0 (want %d), %d of them all ones from both formats", zeros, wantZeros, ones)
	}
}
