package imatrix

import (
	"encoding/binary"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/inputerr"
)

// The tensor name suffixes of llama-imatrix's GGUF output.
const (
	sumsSuffix   = ".in_sum2"
	countsSuffix = ".counts"
)

// readGGUF reads llama-imatrix's GGUF output as common_imatrix_load and
// load_imatrix do: tensors named W.in_sum2 and W.counts pair into entry W
// (other tensors are ignored), and the three imatrix.* keys must all be
// present.
func readGGUF(r io.ReaderAt, size int64, path string) (*Matrix, error) {
	f, err := gguf.Parse(r, size, path)
	if err != nil {
		return nil, err
	}
	if len(f.Tensors) == 0 {
		return nil, inputerr.New(path, "", -1, ErrNoData, "the file has no tensors")
	}
	m := &Matrix{path: path, format: GGUF, entries: map[string][]float32{}}
	if kv, ok := f.KV(keyDatasets); ok {
		if a, ok := kv.Value.(gguf.Array); ok && a.Elem == gguf.ValueString {
			for _, s := range a.Values.([]string) {
				m.datasets = append(m.datasets, cString(s))
			}
		}
	}
	for _, k := range []string{keyDatasets, keyChunkCount, keyChunkSize} {
		if _, ok := f.KV(k); !ok {
			return nil, &Error{Path: path, Key: k, Offset: -1, Err: errorf(ErrMetadata, "the key is missing (llama-quantize needs imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size)")}
		}
	}
	// llama-quantize reads both counts with gguf_get_val_u32, which aborts
	// on any other type, into int32_t.
	for _, k := range []string{keyChunkCount, keyChunkSize} {
		kv, _ := f.KV(k)
		v, ok := kv.Value.(uint32)
		if !ok {
			return nil, &Error{Path: path, Key: k, Offset: -1, Err: errorf(ErrMetadata, "type %s, want UINT32", kv.Type)}
		}
		if k == keyChunkCount {
			m.chunks = int32(v)
		} else {
			m.chunkSize = int32(v)
		}
	}

	type pair struct{ sums, counts *gguf.TensorInfo }
	pairs := map[string]*pair{}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if name, ok := strings.CutSuffix(t.Name, sumsSuffix); ok {
			p := pairs[name]
			if p == nil {
				p = &pair{}
				pairs[name] = p
			}
			p.sums = t
		} else if name, ok := strings.CutSuffix(t.Name, countsSuffix); ok {
			p := pairs[name]
			if p == nil {
				p = &pair{}
				pairs[name] = p
			}
			p.counts = t
		}
	}
	names := make([]string, 0, len(pairs))
	for n := range pairs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		p := pairs[name]
		if p.sums == nil || p.counts == nil {
			return nil, inputerr.New(path, name, -1, ErrMismatch, "")
		}
		for _, t := range []*gguf.TensorInfo{p.sums, p.counts} {
			if t.Type != quant.F32 {
				return nil, inputerr.New(path, name, f.DataOffset+int64(t.Offset), ErrType, "%s is %s", t.Name, t.Type)
			}
		}
		sums, err := readF32(f, p.sums)
		if err != nil {
			return nil, err
		}
		counts, err := readF32(f, p.counts)
		if err != nil {
			return nil, err
		}
		if len(counts) == 0 {
			return nil, inputerr.New(path, name, f.DataOffset+int64(p.counts.Offset), ErrCounts, "%s has dimensions %v", p.counts.Name, p.counts.Dims)
		}
		m.entries[name] = normalize(sums, counts)
	}
	return m, nil
}

// normalize is load_imatrix's GGUF branch: with ne0 = len(sums) /
// len(counts), value i of expert j is sums[j·ne0+i] / count_j in float32,
// where count_j is the count rounded to an integer (lround); an expert
// whose count is not positive gets all ones. Values past len(counts)·ne0
// (sums not a whole number of experts) stay zero, as there.
func normalize(sums, counts []float32) []float32 {
	v := make([]float32, len(sums))
	ne0 := len(sums) / len(counts)
	for j, c := range counts {
		count, ok := roundCount(c)
		row := v[j*ne0 : (j+1)*ne0]
		if !ok {
			for i := range row {
				row[i] = 1
			}
			continue
		}
		for i := range row {
			row[i] = sums[j*ne0+i] / count
		}
	}
	return v
}

// roundCount is (float) std::lround(c) when that is positive. lround
// rounds half away from zero, as math.Round; a NaN, an infinity or a value
// out of int64's range gives LONG_MIN on x86-64, which is not positive.
// An in-range rounded float32 converts to float32 exactly, so the int64
// round trip changes nothing.
func roundCount(c float32) (float32, bool) {
	r := math.Round(float64(c))
	if !(r > 0) || r >= 0x1p63 {
		return 0, false
	}
	return float32(r), true
}

// readF32 reads a little-endian F32 tensor's values. Parse has checked that
// its bytes lie inside the file, so the allocation is bounded by its size.
func readF32(f *gguf.File, t *gguf.TensorInfo) ([]float32, error) {
	b := make([]byte, t.Size())
	if _, err := io.ReadFull(f.Section(*t), b); err != nil {
		return nil, inputerr.New(f.Path, t.Name, f.DataOffset+int64(t.Offset), ErrTruncated, "%v", err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}
