package imatrix

import (
	"bytes"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
)

// FuzzGGUF feeds arbitrary bytes, seeded with GGUF matrices, to Read: it
// must never panic, and a matrix it accepts must match the container: one
// entry per in_sum2 tensor, as many values as it has elements.
func FuzzGGUF(f *testing.F) {
	// A dense model's matrix and two MoE models' (per-expert counts, some 0).
	for _, seed := range []string{"testdata/qwen3-imatrix.gguf", "testdata/qwen35moe-imatrix.gguf", "testdata/qwen35moe32-imatrix.gguf"} {
		if b, err := os.ReadFile(seed); err == nil {
			f.Add(b)
		}
	}
	f.Add(ggufFile(f, metaKVs([]string{"d"}, 2, 4),
		f32("e.in_sum2", []uint64{2, 2}, 1, 2, 3, 4), f32("e.counts", []uint64{1, 2}, 2, 0),
		f32("x.in_sum2", []uint64{1}, 1), f32("x.counts", []uint64{1}, 0.5)))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Read(bytes.NewReader(data), int64(len(data)), "fuzz.gguf")
		if err != nil || m.Format() != GGUF { // FuzzLegacy checks the rest
			return
		}
		file, err := gguf.Parse(bytes.NewReader(data), int64(len(data)), "fuzz.gguf")
		if err != nil {
			t.Fatalf("accepted a file the GGUF reader refuses: %v", err)
		}
		n := 0
		for _, ti := range file.Tensors {
			name, ok := strings.CutSuffix(ti.Name, sumsSuffix)
			if !ok {
				continue
			}
			n++
			if v, ok := m.Lookup(name); !ok || uint64(len(v)) != ti.NumElements() {
				t.Fatalf("%s: %d values for %d elements", name, len(v), ti.NumElements())
			}
		}
		checkMatrix(t, m, n)
	})
}

// FuzzLegacy feeds arbitrary bytes, seeded with .dat matrices, to Read: it
// must never panic, and a matrix it accepts, written back as a .dat with
// ncall 0 (values kept as they are), reads back the same.
func FuzzLegacy(f *testing.F) {
	// A dense model's matrix and two MoE models' (per-expert counts, some 0).
	for _, seed := range []string{"testdata/qwen3-imatrix.dat", "testdata/qwen35moe-imatrix.dat", "testdata/qwen35moe32-imatrix.dat"} {
		if b, err := os.ReadFile(seed); err == nil {
			f.Add(b)
		}
	}
	f.Add(datFile([]datEntry{{"a", 3, []float32{1, 2}}, {"b\x00c", 0, []float32{4}}, {"a", -1, []float32{5}}}, datTrailer(9, "d.txt")))
	f.Add(datFile([]datEntry{{"", 1, []float32{1}}}, []byte{1, 2}))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Read(bytes.NewReader(data), int64(len(data)), "fuzz.dat")
		if err != nil || m.Format() != Legacy {
			return
		}
		checkMatrix(t, m, m.Len())
		var entries []datEntry
		for _, name := range m.Entries() {
			v, _ := m.Lookup(name)
			entries = append(entries, datEntry{name, 0, v})
		}
		dataset := ""
		if ds := m.Datasets(); len(ds) > 0 {
			dataset = ds[0] + "\x00" // an empty name reads back too
		}
		again := read(t, datFile(entries, datTrailer(int32(m.Chunks()), dataset)))
		if !slices.Equal(again.Entries(), m.Entries()) || again.Chunks() != m.Chunks() || !slices.Equal(again.Datasets(), m.Datasets()) {
			t.Fatalf("written back: %q, %d chunks, %q; read %q, %d chunks, %q", again.Entries(), again.Chunks(), again.Datasets(), m.Entries(), m.Chunks(), m.Datasets())
		}
		for _, name := range m.Entries() {
			v, _ := m.Lookup(name)
			w, _ := again.Lookup(name)
			if !bitsEqual(v, w) {
				t.Fatalf("%q: %v written back, %v read", name, w, v)
			}
		}
	})
}

// checkMatrix checks what every accepted matrix must satisfy: n entries,
// sorted, each found by Lookup and none Missing, and KVs that count them.
func checkMatrix(t *testing.T, m *Matrix, n int) {
	t.Helper()
	names := m.Entries()
	if len(names) != n || m.Len() != n || !slices.IsSorted(names) {
		t.Fatalf("%d entries (Len %d), want %d", len(names), m.Len(), n)
	}
	if miss := m.Missing(names); len(miss) != 0 {
		t.Fatalf("entries %q missing", miss)
	}
	_ = m.Finite()
	kvs := m.KVs("f")
	if n == 0 {
		if len(kvs) != 0 {
			t.Fatalf("KVs %v without entries", kvs)
		}
		return
	}
	for _, kv := range kvs {
		switch kv.Key {
		case KeyEntries:
			if kv.Value != uint32(n) {
				t.Fatalf("entries_count %v, want %d", kv.Value, n)
			}
		case KeyChunks:
			if c := kv.Value.(uint32); c == 0 || c > math.MaxInt32 {
				t.Fatalf("chunks_count %d", c)
			}
		case KeyDataset:
			if s := kv.Value.(string); len(s) > maxKVString || strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("dataset %q", s)
			}
		}
	}
}
