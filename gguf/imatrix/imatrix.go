// Package imatrix reads the importance matrices llama-imatrix writes, in
// both of its formats, and gives each weight's importance vector exactly as
// llama-quantize (llama.cpp 34af94c, tools/quantize/quantize.cpp and
// common/imatrix-loader.cpp) loads it and passes it to the quantizers as
// quant_weights.
//
// The GGUF format (the default) holds two F32 tensors per weight W,
// W.in_sum2 (the per-column sums of squared input activations, shape
// [ne0] or, for expert tensors, [ne0, n_expert]) and W.counts (the token
// count per expert, shape [1] or [1, n_expert]), and the metadata keys
// imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size. The
// importance of column i of expert j is in_sum2[j][i] / counts[j] in
// float32, or 1 when that expert saw no token.
//
// The legacy .dat format is little-endian binary: int32 entry count; per
// entry an int32 name length, the name, int32 ncall, int32 nval and nval
// float32 values that llama-imatrix stored as (in_sum2 / count) · ncall;
// then, optionally, int32 chunk count, int32 length and the dataset name.
// The importance is value / ncall in float32, or the value itself when
// ncall is not positive. llama-imatrix writes ncall = ⌈max count /
// chunk_size⌉ (an expert that saw no token is stored as 1 · ncall, which
// loads as exactly 1, the ones the GGUF branch gives it; an entry none of
// whose experts saw a token is left out, so its tensor is quantized
// without weights, where the GGUF gives ones), so the round trip gives
// in_sum2 / count exactly only when ncall is a power of two: for a MoE
// model's expert tensors the two formats of one run load to vectors a few
// ulps apart, and llama-quantize's files made from each differ; here as
// there.
//
// A file that starts with the GGUF magic is read as GGUF, any other as
// .dat. (llama.cpp reads any file its GGUF parser refuses as .dat; one
// that starts with the magic would need over a billion entries to be one.)
// Every count and length is checked against the bytes left before anything
// is allocated; errors are *Error naming the file, the entry and the byte
// offset.
package imatrix

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Error is a bad-input error naming the file, the entry (as Tensor) and the
// absolute byte offset.
type Error = inputerr.Error

// Sentinel errors, wrapped in *Error.
var (
	ErrNoData    = errors.New("no importance matrix entries")
	ErrTruncated = errors.New("file too short")
	ErrLength    = errors.New("invalid length")
	ErrMetadata  = errors.New("missing or invalid imatrix metadata")
	ErrMismatch  = errors.New("in_sum2 without counts, or counts without in_sum2")
	ErrType      = errors.New("in_sum2 and counts must be F32")
	ErrCounts    = errors.New("counts has no elements")
	ErrSize      = errors.New("imatrix size differs from the tensor's")
	ErrNonFinite = errors.New("imatrix contains a non-finite value")
)

// The metadata keys llama-quantize adds to a file quantized with an
// importance matrix (LLM_KV_QUANTIZE_IMATRIX_* in quantize.cpp).
const (
	KeyFile    = "quantize.imatrix.file"
	KeyDataset = "quantize.imatrix.dataset"
	KeyEntries = "quantize.imatrix.entries_count"
	KeyChunks  = "quantize.imatrix.chunks_count"
)

// The keys llama-imatrix writes into its GGUF output.
const (
	keyDatasets   = "imatrix.datasets"
	keyChunkCount = "imatrix.chunk_count"
	keyChunkSize  = "imatrix.chunk_size"
)

// maxKVString is how much of a string llama-quantize keeps in a KV
// override (char val_str[128], filled by strncpy(…, 127)).
const maxKVString = 127

// Format is the file format a Matrix was read from.
type Format int

const (
	GGUF   Format = iota + 1 // llama-imatrix's default output
	Legacy                   // the .dat format (--output-format dat)
)

func (f Format) String() string {
	switch f {
	case GGUF:
		return "gguf"
	case Legacy:
		return "dat"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Matrix is a loaded importance matrix: one vector per entry, the entry
// named as the weight it belongs to (blk.0.attn_q.weight).
type Matrix struct {
	path      string
	format    Format
	entries   map[string][]float32
	datasets  []string
	chunks    int32 // chunk_count as llama-quantize holds it (int32)
	chunkSize int32
}

// Open reads the importance matrix at path.
func Open(path string) (*Matrix, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	return Read(fh, st.Size(), path)
}

// Read reads the importance matrix behind r, size bytes long; path is used
// in errors and by Path.
func Read(r io.ReaderAt, size int64, path string) (*Matrix, error) {
	var magic [4]byte
	if size >= 4 {
		if n, err := r.ReadAt(magic[:], 0); n < 4 {
			return nil, inputerr.Wrap(path, err)
		}
	}
	if size >= 4 && le32(magic[:]) == gguf.Magic {
		return readGGUF(r, size, path)
	}
	return readLegacy(r, size, path)
}

// Path is the path the matrix was read from.
func (m *Matrix) Path() string { return m.path }

// Format is the format the matrix was read from.
func (m *Matrix) Format() Format { return m.format }

// Entries lists the entry names in byte order.
func (m *Matrix) Entries() []string {
	names := make([]string, 0, len(m.entries))
	for n := range m.entries {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Len is the number of entries.
func (m *Matrix) Len() int { return len(m.entries) }

// Datasets are the names of the calibration files, as recorded (GGUF:
// imatrix.datasets when it is an array of strings; .dat: the trailing
// name, when there is one).
func (m *Matrix) Datasets() []string { return slices.Clone(m.datasets) }

// Chunks is the number of chunks the matrix was computed on, as
// llama-quantize reads it (a 32-bit signed value; 0 when the file does not
// say).
func (m *Matrix) Chunks() int { return int(m.chunks) }

// ChunkSize is imatrix.chunk_size (tokens per chunk) of a GGUF matrix, 0
// for a .dat one.
func (m *Matrix) ChunkSize() int { return int(m.chunkSize) }

// Lookup returns the importance vector of the weight named name: ne0
// values per expert, the experts one after another, exactly what
// llama-quantize passes as quant_weights (expert j's row weights start at
// j·ne0). The slice is the Matrix's own: callers must not modify it.
func (m *Matrix) Lookup(name string) ([]float32, bool) {
	v, ok := m.entries[name]
	return v, ok
}

// Weights is llama-quantize's choice of importance vector for the tensor
// name with ggml dimensions dims: nil and no error when the matrix has no
// entry for it (llama-quantize quantizes it without one and logs "did not
// find weights"); the entry when it holds ne0·ne2 values; otherwise an
// ErrSize error, except for token_embd.weight and
// per_layer_token_embd.weight, for which llama-quantize ignores a
// mismatched entry and proceeds without one.
func (m *Matrix) Weights(name string, dims []uint64) ([]float32, error) {
	v, ok := m.entries[name]
	if !ok {
		return nil, nil
	}
	want := uint64(1)
	if len(dims) > 0 {
		want = dims[0]
	}
	if len(dims) > 2 {
		want *= dims[2]
	}
	if uint64(len(v)) == want {
		return v, nil
	}
	if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
		return nil, nil
	}
	return nil, inputerr.New(m.path, name, -1, ErrSize, "imatrix size %d is different from tensor size %d", len(v), want)
}

// Missing lists, in their order, the names that have no entry: given the
// tensors a quantization will quantize, the ones it will quantize without
// importance data (for a Qwen3.5 model, the MTP block, which llama-imatrix
// never runs).
func (m *Matrix) Missing(names []string) []string {
	var out []string
	for _, n := range names {
		if _, ok := m.entries[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// Include keeps only the entries whose name contains one of substrs, as
// llama-quantize's --include-weights does; Exclude drops them, as
// --exclude-weights does. (llama-quantize refuses the two together.)
// Both return a new Matrix sharing m's vectors.
func (m *Matrix) Include(substrs []string) *Matrix {
	return m.filter(func(name string) bool { return containsAny(name, substrs) })
}

// Exclude: see Include.
func (m *Matrix) Exclude(substrs []string) *Matrix {
	return m.filter(func(name string) bool { return !containsAny(name, substrs) })
}

func (m *Matrix) filter(keep func(string) bool) *Matrix {
	c := *m
	c.entries = make(map[string][]float32, len(m.entries))
	for n, v := range m.entries {
		if keep(n) {
			c.entries[n] = v
		}
	}
	c.datasets = slices.Clone(m.datasets)
	return &c
}

func containsAny(s string, substrs []string) bool {
	for _, sub := range substrs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// Finite returns an ErrNonFinite error naming the first entry (in name
// order) holding a NaN or an infinity: llama-quantize refuses such a
// matrix ("imatrix contains non-finite value") before writing anything.
func (m *Matrix) Finite() error {
	for _, n := range m.Entries() {
		for i, f := range m.entries[n] {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return inputerr.New(m.path, n, -1, ErrNonFinite, "value %d is %v", i, f)
			}
		}
	}
	return nil
}

// KVs are the metadata pairs llama-quantize adds to its output when given
// this matrix as --imatrix file, in its order and with its types:
// quantize.imatrix.file (file as given, at most 127 bytes), .dataset (the
// first dataset, at most 127 bytes, when there is one), .entries_count
// (UINT32) and .chunks_count (UINT32, when the chunk count is positive).
// With no entries (all filtered out) llama-quantize uses no matrix and adds
// nothing: KVs is empty.
func (m *Matrix) KVs(file string) []gguf.KV {
	if len(m.entries) == 0 {
		return nil
	}
	kvs := []gguf.KV{{Key: KeyFile, Type: gguf.ValueString, Value: truncate(file, maxKVString)}}
	if len(m.datasets) > 0 {
		kvs = append(kvs, gguf.KV{Key: KeyDataset, Type: gguf.ValueString, Value: truncate(m.datasets[0], maxKVString)})
	}
	kvs = append(kvs, gguf.KV{Key: KeyEntries, Type: gguf.ValueUint32, Value: uint32(len(m.entries))})
	if m.chunks > 0 {
		kvs = append(kvs, gguf.KV{Key: KeyChunks, Type: gguf.ValueUint32, Value: uint32(m.chunks)})
	}
	return kvs
}

// truncate cuts s at its first NUL (llama.cpp keeps these as C strings)
// and then to n bytes.
func truncate(s string, n int) string {
	s = cString(s)
	if len(s) > n {
		return s[:n]
	}
	return s
}

// cString is s up to its first NUL byte.
func cString(s string) string {
	if i := strings.IndexByte(s, 0); i >= 0 {
		return s[:i]
	}
	return s
}

func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
