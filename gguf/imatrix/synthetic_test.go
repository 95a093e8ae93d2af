package imatrix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
)

// tensor is one tensor of a synthetic GGUF matrix; its values are written
// as F32 whatever Type says, padded or cut to the type's size.
type tensor struct {
	name string
	dims []uint64
	typ  quant.Type
	vals []float32
}

func f32(name string, dims []uint64, vals ...float32) tensor {
	return tensor{name, dims, quant.F32, vals}
}

// metaKVs are llama-imatrix's three keys.
func metaKVs(datasets []string, chunks, chunkSize uint32) []gguf.KV {
	return []gguf.KV{
		{Key: "general.type", Type: gguf.ValueString, Value: "imatrix"},
		{Key: keyDatasets, Type: gguf.ValueArray, Value: gguf.Array{Elem: gguf.ValueString, Values: datasets}},
		{Key: keyChunkCount, Type: gguf.ValueUint32, Value: chunks},
		{Key: keyChunkSize, Type: gguf.ValueUint32, Value: chunkSize},
	}
}

// ggufFile encodes a GGUF file in memory.
func ggufFile(t testing.TB, kvs []gguf.KV, ts ...tensor) []byte {
	t.Helper()
	specs := make([]gguf.TensorSpec, len(ts))
	for i, x := range ts {
		specs[i] = gguf.TensorSpec{Name: x.name, Dims: x.dims, Type: x.typ}
	}
	l, err := gguf.PlanLayout(kvs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, l.Size)
	copy(b, l.Header)
	for i, x := range ts {
		var data []byte
		for _, v := range x.vals {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
		}
		off := l.TensorOffset(i)
		copy(b[off:off+l.Tensors[i].Size()], data)
	}
	return b
}

// datEntry is one entry of a synthetic .dat matrix.
type datEntry struct {
	name  string
	ncall int32
	vals  []float32
}

// datFile encodes a .dat matrix: the entries, then trailer as is.
func datFile(entries []datEntry, trailer []byte) []byte {
	le := binary.LittleEndian
	b := le.AppendUint32(nil, uint32(len(entries)))
	for _, e := range entries {
		b = le.AppendUint32(b, uint32(len(e.name)))
		b = append(b, e.name...)
		b = le.AppendUint32(b, uint32(e.ncall))
		b = le.AppendUint32(b, uint32(len(e.vals)))
		for _, v := range e.vals {
			b = le.AppendUint32(b, math.Float32bits(v))
		}
	}
	return append(b, trailer...)
}

// datTrailer is the chunk count and dataset name llama-imatrix appends.
func datTrailer(chunks int32, dataset string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(chunks))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dataset)))
	return append(b, dataset...)
}

func read(t testing.TB, b []byte) *Matrix {
	t.Helper()
	m, err := Read(bytes.NewReader(b), int64(len(b)), "m")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestGGUFExperts checks the GGUF normalisation on an expert tensor
// ([ne0, n_expert] sums, [1, n_expert] counts): each expert divided by its
// own count rounded half away from zero (lround), ones for an expert with
// no tokens (a count that rounds to zero, is negative or NaN), and the
// experts concatenated as llama-quantize passes them.
func TestGGUFExperts(t *testing.T) {
	nan := float32(math.NaN())
	b := ggufFile(t, metaKVs([]string{"a.txt", "b.txt"}, 3, 512),
		f32("blk.0.ffn_down_exps.weight.in_sum2", []uint64{2, 7}, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14),
		f32("blk.0.ffn_down_exps.weight.counts", []uint64{1, 7}, 2, 0.4, 2.5, -3, nan, 1e30, 1e18),
		f32("blk.0.ffn_up.weight.in_sum2", []uint64{3}, 3, 6, 9),
		f32("blk.0.ffn_up.weight.counts", []uint64{1}, 3),
		f32("output_norm.weight", []uint64{4}, 1, 1, 1, 1), // not an entry
	)
	m := read(t, b)
	if got := m.Entries(); !slices.Equal(got, []string{"blk.0.ffn_down_exps.weight", "blk.0.ffn_up.weight"}) {
		t.Fatalf("entries %q", got)
	}
	v, _ := m.Lookup("blk.0.ffn_down_exps.weight")
	big := float32(1e18) // rounds to itself; 1e30 is past int64, so lround fails
	want := []float32{0.5, 1, 1, 1, 5.0 / 3, 6.0 / 3, 1, 1, 1, 1, 1, 1, 13 / big, 14 / big}
	if !bitsEqual(v, want) {
		t.Errorf("experts: %v, want %v", v, want)
	}
	if v, _ := m.Lookup("blk.0.ffn_up.weight"); !bitsEqual(v, []float32{1, 2, 3}) {
		t.Errorf("ffn_up: %v", v)
	}
	if m.Chunks() != 3 || m.ChunkSize() != 512 || !slices.Equal(m.Datasets(), []string{"a.txt", "b.txt"}) {
		t.Errorf("chunks %d, chunk size %d, datasets %q", m.Chunks(), m.ChunkSize(), m.Datasets())
	}

	// Weights wants ne0 · ne2 values: [2, rows, 6] for the experts.
	if w, err := m.Weights("blk.0.ffn_down_exps.weight", []uint64{2, 5, 7}); err != nil || len(w) != 14 {
		t.Errorf("Weights(experts) = %d values, %v", len(w), err)
	}
	if _, err := m.Weights("blk.0.ffn_down_exps.weight", []uint64{2, 7}); !errors.Is(err, ErrSize) || !strings.Contains(err.Error(), `tensor "blk.0.ffn_down_exps.weight"`) {
		t.Errorf("Weights with the wrong shape: %v", err)
	}
	if w, err := m.Weights("blk.0.attn_q.weight", []uint64{2, 6}); w != nil || err != nil {
		t.Errorf("Weights(no entry) = %v, %v", w, err)
	}
}

// TestGGUFUneven: sums that are not a whole number of experts leave the
// values past the last whole one at zero, as llama-quantize does.
func TestGGUFUneven(t *testing.T) {
	m := read(t, ggufFile(t, metaKVs(nil, 0, 0),
		f32("w.counts", []uint64{2}, 2, 4),
		f32("w.in_sum2", []uint64{7}, 2, 4, 6, 8, 12, 16, 99),
	))
	if v, _ := m.Lookup("w"); !bitsEqual(v, []float32{1, 2, 3, 2, 3, 4, 0}) {
		t.Errorf("%v", v)
	}
	// No dataset, no chunks: KVs has the file and the entry count only.
	kvs := m.KVs(strings.Repeat("d/", 70) + "im.gguf")
	if len(kvs) != 2 || kvs[0].Key != KeyFile || len(kvs[0].Value.(string)) != 127 || kvs[1].Key != KeyEntries || kvs[1].Value != uint32(1) {
		t.Errorf("KVs %v", kvs)
	}
}

// TestGGUFErrors: the files llama-quantize refuses, and one it would crash
// on (counts with no elements: a division by zero).
func TestGGUFErrors(t *testing.T) {
	meta := metaKVs([]string{"c.txt"}, 1, 1)
	sums := f32("w.in_sum2", []uint64{2}, 1, 2)
	counts := f32("w.counts", []uint64{1}, 1)
	f16 := tensor{"w.counts", []uint64{2}, quant.F16, nil}
	tests := []struct {
		name string
		kvs  []gguf.KV
		ts   []tensor
		want error
		in   string // in the message
	}{
		{"no tensors", meta, nil, ErrNoData, "no tensors"},
		{"no datasets", meta[2:], []tensor{sums, counts}, ErrMetadata, `key "imatrix.datasets"`},
		{"no chunk_count", slices.Delete(slices.Clone(meta), 2, 3), []tensor{sums, counts}, ErrMetadata, `key "imatrix.chunk_count"`},
		{"chunk_size not u32", append(slices.Clone(meta[:3]), gguf.KV{Key: keyChunkSize, Type: gguf.ValueInt32, Value: int32(1)}), []tensor{sums, counts}, ErrMetadata, "INT32"},
		{"sums alone", meta, []tensor{sums}, ErrMismatch, `tensor "w"`},
		{"counts alone", meta, []tensor{counts}, ErrMismatch, `tensor "w"`},
		{"F16 counts", meta, []tensor{sums, f16}, ErrType, "w.counts is F16"},
		{"empty counts", meta, []tensor{sums, f32("w.counts", []uint64{0})}, ErrCounts, "offset"},
	}
	for _, tt := range tests {
		b := ggufFile(t, tt.kvs, tt.ts...)
		_, err := Read(bytes.NewReader(b), int64(len(b)), "bad.gguf")
		if !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "bad.gguf") || !strings.Contains(err.Error(), tt.in) {
			t.Errorf("%s: %v, want %v naming %s", tt.name, err, tt.want, tt.in)
		}
	}
	// A GGUF the container reader refuses is reported as such.
	b := ggufFile(t, meta, sums, counts)
	if _, err := Read(bytes.NewReader(b[:len(b)-32]), int64(len(b)-32), "cut.gguf"); !errors.Is(err, gguf.ErrDataRange) {
		t.Errorf("truncated GGUF: %v", err)
	}
}

// TestLegacy checks the .dat reading: value / ncall, raw values when ncall
// is not positive, a later entry of the same name replacing an earlier
// one, names and the dataset cut at a NUL, and the trailer read as far as
// it goes.
func TestLegacy(t *testing.T) {
	entries := []datEntry{
		{"b", 3, []float32{3, 1, 6}},
		{"a", 0, []float32{5, 7}},
		{"c", -2, []float32{4}},
		{"x\x00junk", 2, []float32{8}},
		{"b", 4, []float32{8, 4}},
	}
	tests := []struct {
		name     string
		trailer  []byte
		chunks   int
		datasets []string
	}{
		{"trailer", datTrailer(64, "calib.txt"), 64, []string{"calib.txt"}},
		{"no trailer", nil, 0, nil},
		{"short chunk count", []byte{0x10, 0x01}, 0x110, nil},
		{"chunks only", datTrailer(7, "")[:4], 7, nil},
		{"empty dataset", datTrailer(7, ""), 7, nil},
		{"dataset past the end", datTrailer(9, "calib.txt")[:12], 9, nil},
		{"dataset with NUL", datTrailer(5, "c.txt\x00x"), 5, []string{"c.txt"}},
		{"trailing bytes", append(datTrailer(5, "c.txt"), 1, 2, 3), 5, []string{"c.txt"}},
		{"negative chunks", datTrailer(-5, "c"), -5, []string{"c"}},
	}
	for _, tt := range tests {
		m := read(t, datFile(entries, tt.trailer))
		if m.Format() != Legacy || m.Chunks() != tt.chunks || !slices.Equal(m.Datasets(), tt.datasets) {
			t.Errorf("%s: %s, chunks %d, datasets %q; want %d, %q", tt.name, m.Format(), m.Chunks(), m.Datasets(), tt.chunks, tt.datasets)
		}
		if !slices.Equal(m.Entries(), []string{"a", "b", "c", "x"}) {
			t.Fatalf("%s: entries %q", tt.name, m.Entries())
		}
		for name, want := range map[string][]float32{"a": {5, 7}, "b": {2, 1}, "c": {4}, "x": {4}} {
			if v, _ := m.Lookup(name); !bitsEqual(v, want) {
				t.Errorf("%s: %s = %v, want %v", tt.name, name, v, want)
			}
		}
		var keys []string
		for _, kv := range m.KVs("i.dat") {
			keys = append(keys, kv.Key)
		}
		want := []string{KeyFile}
		if tt.datasets != nil {
			want = append(want, KeyDataset)
		}
		want = append(want, KeyEntries)
		if tt.chunks > 0 {
			want = append(want, KeyChunks)
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s: KVs %q, want %q", tt.name, keys, want)
		}
	}
	// ncall 3 divides in float32: 1/3 is float32(1)/float32(3).
	if v, _ := read(t, datFile([]datEntry{{"w", 3, []float32{1}}}, nil)).Lookup("w"); v[0] != float32(1)/float32(3) {
		t.Errorf("1/3 = %v", v[0])
	}
}

// TestLegacyErrors: every length is checked before it is used, and the
// error names the file, the entry and the offset.
func TestLegacyErrors(t *testing.T) {
	le := binary.LittleEndian
	one := datFile([]datEntry{{"w", 1, []float32{1, 2}}}, nil)
	tests := []struct {
		name string
		b    []byte
		want error
		in   string
	}{
		{"empty", nil, ErrNoData, "at offset 0"},
		{"zero entries", le.AppendUint32(nil, 0), ErrNoData, "entry count 0"},
		{"negative entries", le.AppendUint32(nil, 0xffffffff), ErrNoData, "entry count -1"},
		{"too many entries", append(le.AppendUint32(nil, 2), one[4:]...), ErrTruncated, "2 entries need"},
		{"negative name length", append(le.AppendUint32(slices.Clone(one[:4]), 0xfffffffe), make([]byte, 16)...), ErrLength, "entry 0: name length -2"},
		{"name past the end", append(le.AppendUint32(slices.Clone(one[:4]), 100), make([]byte, 16)...), ErrTruncated, "name length 100 with 16 bytes left"},
		{"nval 0", append(slices.Clone(one[:13]), append(le.AppendUint32(nil, 0), make([]byte, 8)...)...), ErrLength, `tensor "w" at offset 13: invalid length: entry 0: 0 values`},
		{"values cut", one[:len(one)-1], ErrTruncated, `tensor "w" at offset 13: file too short: entry 0: 2 values with 7 bytes left`},
		{"second entry cut", append(le.AppendUint32(nil, 2), append(one[4:], make([]byte, 16)...)...), ErrLength, "at offset 33: invalid length: entry 1: 0 values"},
	}
	for _, tt := range tests {
		_, err := Read(bytes.NewReader(tt.b), int64(len(tt.b)), "bad.dat")
		if !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), "bad.dat") || !strings.Contains(err.Error(), tt.in) {
			t.Errorf("%s: %v, want %v naming %q", tt.name, err, tt.want, tt.in)
		}
	}
}

// TestFilters: Include and Exclude match substrings as --include-weights
// and --exclude-weights do, and filtering everything out leaves no KVs
// (llama-quantize then uses no matrix at all).
func TestFilters(t *testing.T) {
	m := read(t, datFile([]datEntry{{"blk.0.attn_q.weight", 1, []float32{1}}, {"blk.0.ffn_up.weight", 1, []float32{2}}, {"blk.1.attn_q.weight", 1, []float32{3}}}, datTrailer(2, "d")))
	tests := []struct {
		got  *Matrix
		want []string
	}{
		{m.Include([]string{"attn_q", "blk.1"}), []string{"blk.0.attn_q.weight", "blk.1.attn_q.weight"}},
		{m.Include([]string{"ffn"}), []string{"blk.0.ffn_up.weight"}},
		{m.Exclude([]string{"blk.0."}), []string{"blk.1.attn_q.weight"}},
		{m.Exclude([]string{"weight"}), []string{}},
	}
	for i, tt := range tests {
		if got := tt.got.Entries(); !slices.Equal(got, tt.want) {
			t.Errorf("%d: %q, want %q", i, got, tt.want)
		}
		kvs := tt.got.KVs("f")
		if len(tt.want) == 0 && len(kvs) != 0 || len(tt.want) > 0 && kvs[2].Value != uint32(len(tt.want)) {
			t.Errorf("%d: KVs %v", i, kvs)
		}
	}
	if m.Len() != 3 || m.Chunks() != 2 {
		t.Errorf("the filters changed the original: %d entries", m.Len())
	}
}

// TestFinite: a NaN or infinity anywhere fails, naming the entry.
func TestFinite(t *testing.T) {
	ok := read(t, datFile([]datEntry{{"a", 1, []float32{1, 2}}}, nil))
	if err := ok.Finite(); err != nil {
		t.Error(err)
	}
	inf := float32(math.Inf(1))
	bad := read(t, datFile([]datEntry{{"a", 1, []float32{1}}, {"b", 0, []float32{1, inf}}}, nil))
	if err := bad.Finite(); !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), `tensor "b"`) || !strings.Contains(err.Error(), "value 1") {
		t.Errorf("%v", err)
	}
	if err := bad.Exclude([]string{"b"}).Finite(); err != nil {
		t.Errorf("after excluding b: %v", err)
	}
}
