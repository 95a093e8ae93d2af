package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"unsafe"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// Magic is "GGUF" read as a little-endian uint32.
const Magic = 0x46554747

// Version is the only GGUF version this package reads and writes.
const Version = 3

// DefaultAlignment is GGUF_DEFAULT_ALIGNMENT.
const DefaultAlignment = 32

// MaxDims is GGML_MAX_DIMS.
const MaxDims = 4

// MaxNameLen is GGML_MAX_NAME: a tensor name must be shorter.
const MaxNameLen = 64

// Limits on what the reader allocates, on top of "no more than the bytes
// left in the file". A Qwen3.5 vocabulary is 248,320 tokens; these leave
// two orders of magnitude of room.
const (
	MaxTensors     = 1 << 22
	MaxKVs         = 1 << 20
	MaxArrayLen    = 1 << 26
	MaxStringLen   = 1 << 28
	maxHeaderBytes = 1 << 32 // total of all strings and arrays read
)

// readBuf is the header read-ahead. Items longer than it (long strings,
// numeric arrays) are read straight into their destination, so the parser
// reads the header plus at most readBuf bytes past its end.
const readBuf = 4096

// KV is one metadata pair. Value holds a Go scalar of the matching kind
// (uint8, int8, uint16, int16, uint32, int32, float32, bool, string, uint64,
// int64, float64) or an Array.
type KV struct {
	Key   string
	Type  ValueType
	Value any
}

// Array is an ARRAY value: Values is a typed slice ([]uint32, []string,
// []bool, …) of element type Elem. Nested arrays are not supported (the
// llama.cpp reader refuses them too).
type Array struct {
	Elem   ValueType
	Values any
}

// Len is the number of elements.
func (a Array) Len() int {
	switch v := a.Values.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []uint16:
		return len(v)
	case []int16:
		return len(v)
	case []uint32:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []bool:
		return len(v)
	case []string:
		return len(v)
	case []uint64:
		return len(v)
	case []int64:
		return len(v)
	case []float64:
		return len(v)
	}
	return 0
}

// String returns the value if it is a STRING.
func (kv KV) String() (string, bool) { s, ok := kv.Value.(string); return s, ok }

// Uint returns an unsigned or non-negative signed integer value as uint64.
func (kv KV) Uint() (uint64, bool) {
	switch v := kv.Value.(type) {
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int8:
		return uint64(v), v >= 0
	case int16:
		return uint64(v), v >= 0
	case int32:
		return uint64(v), v >= 0
	case int64:
		return uint64(v), v >= 0
	}
	return 0, false
}

// TensorInfo is one tensor's header entry.
type TensorInfo struct {
	Name   string
	Dims   []uint64 // ggml order: ne0 (the contiguous dimension) first
	Type   quant.Type
	Offset uint64 // relative to the data section (File.DataOffset)
}

// NumElements is the product of Dims.
func (t TensorInfo) NumElements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Size is the tensor's byte length (without alignment padding), or -1 when
// the type is unknown or ne0 is not a whole number of blocks.
func (t TensorInfo) Size() int64 {
	ne0 := uint64(1)
	if len(t.Dims) > 0 {
		ne0 = t.Dims[0]
	}
	row, ok := t.Type.RowSize(ne0)
	if !ok {
		return -1
	}
	n := row
	for _, d := range t.Dims[min(1, len(t.Dims)):] {
		n *= d
	}
	return int64(n)
}

// File is a parsed GGUF header.
type File struct {
	Path       string
	Size       int64
	Version    uint32
	KVs        []KV
	Tensors    []TensorInfo
	Alignment  uint64
	DataOffset int64 // absolute offset of the data section
	HeaderRead int64 // bytes of the file the parser read (the header)

	// Parts are the files of a split (nil for one file): File is then
	// the whole model as one file made of them would be (KVs without the
	// split.* keys, tensors in order at that file's offsets), read from
	// the parts (OpenSplit).
	Parts []Part

	r       io.ReaderAt
	closer  io.Closer
	kvIndex map[string]int
	tIndex  map[string]int
}

// KV looks a metadata pair up by key.
func (f *File) KV(key string) (KV, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return KV{}, false
	}
	return f.KVs[i], true
}

// Tensor looks a tensor up by name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.tIndex[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// Section returns a reader over exactly t's bytes.
func (f *File) Section(t TensorInfo) *io.SectionReader {
	return io.NewSectionReader(f.r, f.DataOffset+int64(t.Offset), t.Size())
}

// ReaderAt is the underlying reader.
func (f *File) ReaderAt() io.ReaderAt { return f.r }

// Architecture is general.architecture, or "".
func (f *File) Architecture() string {
	kv, _ := f.KV("general.architecture")
	s, _ := kv.String()
	return s
}

// Close closes the file if Open opened it.
func (f *File) Close() error {
	if f.closer != nil {
		return f.closer.Close()
	}
	return nil
}

// Open opens the GGUF file at path and parses its header; the first part
// of a split opens the whole split (OpenSplit). The caller closes the
// returned File.
func Open(path string) (*File, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	return OpenSplit(f)
}

// OpenFile opens the one GGUF file at path and parses its header, a part
// of a split as it is. The caller closes the returned File.
func OpenFile(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := fh.Stat()
	if err != nil {
		fh.Close()
		return nil, err
	}
	f, err := Parse(fh, st.Size(), path)
	if err != nil {
		fh.Close()
		return nil, err
	}
	f.closer = fh
	return f, nil
}

// hdr is a bounded, position-tracking reader over the header.
type hdr struct {
	path   string
	br     *bufio.Reader
	pos    int64
	size   int64
	budget int64 // bytes of strings and arrays still allowed
	scr    [8]byte
}

func (h *hdr) errAt(off int64, key, tensor string, sentinel error, format string, args ...any) error {
	err := sentinel
	if format != "" {
		err = fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)
	}
	return &Error{Path: h.path, Key: key, Tensor: tensor, Offset: off, Err: err}
}

func (h *hdr) left() int64 { return h.size - h.pos }

func (h *hdr) read(p []byte, what string) error {
	if int64(len(p)) > h.left() {
		return h.errAt(h.pos, "", "", ErrTruncated, "%s needs %d bytes, %d left", what, len(p), h.left())
	}
	n, err := io.ReadFull(h.br, p)
	h.pos += int64(n)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return h.errAt(h.pos, "", "", ErrTruncated, "reading %s", what)
		}
		return fmt.Errorf("%s at offset %d: %w", h.path, h.pos, err)
	}
	return nil
}

func (h *hdr) u32(what string) (uint32, error) {
	if err := h.read(h.scr[:4], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(h.scr[:4]), nil
}

func (h *hdr) u64(what string) (uint64, error) {
	if err := h.read(h.scr[:8], what); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(h.scr[:8]), nil
}

func (h *hdr) str(what string) (string, error) {
	at := h.pos
	n, err := h.u64(what + " length")
	if err != nil {
		return "", err
	}
	if n > MaxStringLen {
		return "", h.errAt(at, "", "", ErrTooLarge, "%s length %d over the %d limit", what, n, MaxStringLen)
	}
	if int64(n) > h.left() {
		return "", h.errAt(at, "", "", ErrTruncated, "%s length %d but only %d bytes left", what, n, h.left())
	}
	if int64(n) > h.budget {
		return "", h.errAt(at, "", "", ErrTooLarge, "header strings and arrays over %d bytes", int64(maxHeaderBytes))
	}
	h.budget -= int64(n)
	b := make([]byte, n)
	if err := h.read(b, what); err != nil {
		return "", err
	}
	return string(b), nil
}

// Parse reads and validates the header of the GGUF file behind r, which is
// size bytes long, with llama.cpp's rules (gguf_init_from_file_impl). It
// reads only the header, never the data section. path is used in errors.
func Parse(r io.ReaderAt, size int64, path string) (*File, error) {
	h := &hdr{
		path:   path,
		br:     bufio.NewReaderSize(io.NewSectionReader(r, 0, size), readBuf),
		size:   size,
		budget: maxHeaderBytes,
	}
	f := &File{Path: path, Size: size, r: r, kvIndex: map[string]int{}, tIndex: map[string]int{}}
	if size < 4 {
		return nil, h.errAt(0, "", "", ErrBadMagic, "%d bytes", size)
	}
	magic, err := h.u32("magic")
	if err != nil {
		return nil, err
	}
	if magic != Magic {
		return nil, h.errAt(0, "", "", ErrBadMagic, "first bytes %q", le32(magic))
	}
	if f.Version, err = h.u32("version"); err != nil {
		return nil, err
	}
	if f.Version != Version {
		return nil, h.errAt(4, "", "", ErrVersion, "version %d, want %d", f.Version, Version)
	}
	nTensors, err := h.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := h.u64("metadata count")
	if err != nil {
		return nil, err
	}
	// Each tensor info needs at least 24 bytes, each KV at least 13.
	if nTensors > MaxTensors {
		return nil, h.errAt(8, "", "", ErrTooLarge, "tensor count %d over the %d limit", nTensors, MaxTensors)
	}
	if nKV > MaxKVs {
		return nil, h.errAt(16, "", "", ErrTooLarge, "metadata count %d over the %d limit", nKV, MaxKVs)
	}
	if nTensors > uint64(h.left())/24 {
		return nil, h.errAt(8, "", "", ErrTruncated, "tensor count %d needs at least %d bytes, %d left", nTensors, nTensors*24, h.left())
	}
	if nKV > uint64(h.left())/13 {
		return nil, h.errAt(16, "", "", ErrTruncated, "metadata count %d needs at least %d bytes, %d left", nKV, nKV*13, h.left())
	}

	f.KVs = make([]KV, 0, nKV)
	for i := uint64(0); i < nKV; i++ {
		at := h.pos
		key, err := h.str("key")
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[key]; dup {
			return nil, h.errAt(at, key, "", ErrDuplicateKey, "")
		}
		kv, err := h.value(key)
		if err != nil {
			return nil, err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, kv)
	}

	f.Alignment = DefaultAlignment
	if kv, ok := f.KV("general.alignment"); ok {
		a, isU32 := kv.Value.(uint32)
		if !isU32 || a == 0 || a&(a-1) != 0 {
			return nil, h.errAt(-1, "general.alignment", "", ErrAlignment, "%v of type %s; want a power of two of type UINT32", kv.Value, kv.Type)
		}
		f.Alignment = uint64(a)
	}

	f.Tensors = make([]TensorInfo, 0, nTensors)
	var expect uint64 // the next tensor's offset
	for i := uint64(0); i < nTensors; i++ {
		at := h.pos
		name, err := h.str("tensor name")
		if err != nil {
			return nil, err
		}
		if len(name) >= MaxNameLen {
			return nil, h.errAt(at, "", name, ErrTensorName, "%d bytes, the limit is %d", len(name), MaxNameLen-1)
		}
		if name == "" {
			// No tensor can be looked up, or written, under an empty name.
			return nil, h.errAt(at, "", name, ErrTensorName, "empty")
		}
		if _, dup := f.tIndex[name]; dup {
			return nil, h.errAt(at, "", name, ErrDuplicateTensor, "")
		}
		dimsAt := h.pos
		nd, err := h.u32("n_dims")
		if err != nil {
			return nil, err
		}
		if nd > MaxDims {
			return nil, h.errAt(dimsAt, "", name, ErrDims, "n_dims %d, at most %d", nd, MaxDims)
		}
		t := TensorInfo{Name: name, Dims: make([]uint64, nd)}
		elems := uint64(1)
		for j := range t.Dims {
			d, err := h.u64("dimension")
			if err != nil {
				return nil, err
			}
			if d > math.MaxInt64 {
				return nil, h.errAt(h.pos-8, "", name, ErrDims, "ne[%d] = %d is out of range (at most %d)", j, d, int64(math.MaxInt64))
			}
			hi, lo := bits.Mul64(elems, d)
			if hi != 0 || lo > math.MaxInt64 {
				// The raw values read so far, this one included.
				return nil, h.errAt(dimsAt, "", name, ErrDims, "ne[%d] = %d is out of range: dimensions %v have more than %d elements", j, d, append(t.Dims[:j:j], d), int64(math.MaxInt64))
			}
			elems = lo
			t.Dims[j] = d
		}
		typeAt := h.pos
		ty, err := h.u32("type")
		if err != nil {
			return nil, err
		}
		t.Type = quant.Type(ty)
		if !t.Type.Known() {
			return nil, h.errAt(typeAt, "", name, ErrUnknownType, "type code %d", ty)
		}
		ne0 := uint64(1)
		if nd > 0 {
			ne0 = t.Dims[0]
		}
		if ne0%uint64(t.Type.BlockSize()) != 0 {
			return nil, h.errAt(dimsAt, "", name, ErrBlockSize, "ne[0] = %d, %s blocks hold %d", ne0, t.Type, t.Type.BlockSize())
		}
		// bytes = elems / block * typeSize must fit in int64.
		hi, nbytes := bits.Mul64(elems/uint64(t.Type.BlockSize()), uint64(t.Type.TypeSize()))
		if hi != 0 || nbytes > math.MaxInt64/2 {
			return nil, h.errAt(dimsAt, "", name, ErrDims, "dimensions %v are out of range: their %s byte size overflows int64", t.Dims, t.Type)
		}
		offAt := h.pos
		if t.Offset, err = h.u64("offset"); err != nil {
			return nil, err
		}
		if t.Offset != expect {
			return nil, h.errAt(offAt, "", name, ErrOffset, "has offset %d, expected %d", t.Offset, expect)
		}
		padded, ok := alignUp(nbytes, f.Alignment)
		if !ok || padded > math.MaxInt64-expect {
			return nil, h.errAt(dimsAt, "", name, ErrDims, "data section size overflows")
		}
		expect += padded
		f.tIndex[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, t)
	}
	f.HeaderRead = h.pos
	start, ok := alignUp(uint64(h.pos), f.Alignment)
	if !ok {
		return nil, h.errAt(h.pos, "", "", ErrDataRange, "data section start overflows")
	}
	f.DataOffset = int64(start)
	// Offsets are contiguous and increasing, so the first tensor whose
	// bytes end past the file is the first one a truncated file lacks: name
	// that one, not the last.
	for _, t := range f.Tensors {
		end := uint64(f.DataOffset) + t.Offset + uint64(t.Size())
		if end > uint64(size) || uint64(f.DataOffset)+t.Offset < uint64(f.DataOffset) {
			return nil, &Error{Path: path, Tensor: t.Name, Offset: f.DataOffset + int64(t.Offset),
				Err: fmt.Errorf("%w: data ends at %d but the file has %d bytes", ErrDataRange, end, size)}
		}
	}
	return f, nil
}

func alignUp(n, a uint64) (uint64, bool) {
	r := (n + a - 1) / a * a
	return r, r >= n
}

func le32(v uint32) string {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return string(b[:])
}

func (h *hdr) value(key string) (KV, error) {
	at := h.pos
	vt, err := h.u32("value type")
	if err != nil {
		return KV{}, err
	}
	kv := KV{Key: key, Type: ValueType(vt)}
	if !kv.Type.Known() {
		return KV{}, h.errAt(at, key, "", ErrValueType, "type code %d", vt)
	}
	if kv.Type != ValueArray {
		kv.Value, err = h.scalar(kv.Type, key)
		return kv, err
	}
	et, err := h.u32("array element type")
	if err != nil {
		return KV{}, err
	}
	elem := ValueType(et)
	if !elem.Known() || elem == ValueArray {
		return KV{}, h.errAt(at+4, key, "", ErrValueType, "array element type code %d (nested arrays are not supported)", et)
	}
	nAt := h.pos
	n, err := h.u64("array length")
	if err != nil {
		return KV{}, err
	}
	minSize := elem.size()
	if elem == ValueString {
		minSize = 8
	}
	if n > MaxArrayLen {
		return KV{}, h.errAt(nAt, key, "", ErrTooLarge, "array of %d %s over the %d limit", n, elem, MaxArrayLen)
	}
	if n > uint64(h.left())/uint64(minSize) {
		return KV{}, h.errAt(nAt, key, "", ErrTruncated, "array of %d %s needs at least %d bytes, %d left", n, elem, n*uint64(minSize), h.left())
	}
	if elem != ValueString {
		if int64(n)*minSize > h.budget {
			return KV{}, h.errAt(nAt, key, "", ErrTooLarge, "header strings and arrays over %d bytes", int64(maxHeaderBytes))
		}
		h.budget -= int64(n) * minSize
	}
	arr, err := h.array(elem, int(n), key)
	if err != nil {
		return KV{}, err
	}
	kv.Value = Array{Elem: elem, Values: arr}
	return kv, nil
}

func (h *hdr) scalar(t ValueType, key string) (any, error) {
	at := h.pos
	var err error
	wrap := func(v any) (any, error) {
		if err != nil {
			var ge *Error
			if errors.As(err, &ge) && ge.Key == "" {
				ge.Key = key
			}
			return nil, err
		}
		return v, nil
	}
	switch t {
	case ValueUint8, ValueInt8, ValueBool:
		err = h.read(h.scr[:1], t.String())
		if err != nil {
			return wrap(nil)
		}
		switch t {
		case ValueUint8:
			return h.scr[0], nil
		case ValueInt8:
			return int8(h.scr[0]), nil
		}
		if h.scr[0] > 1 {
			return nil, h.errAt(at, key, "", ErrValueType, "BOOL byte %d", h.scr[0])
		}
		return h.scr[0] == 1, nil
	case ValueUint16, ValueInt16:
		err = h.read(h.scr[:2], t.String())
		v := binary.LittleEndian.Uint16(h.scr[:2])
		if t == ValueInt16 {
			return wrap(int16(v))
		}
		return wrap(v)
	case ValueUint32, ValueInt32, ValueFloat32:
		var v uint32
		v, err = h.u32(t.String())
		switch t {
		case ValueInt32:
			return wrap(int32(v))
		case ValueFloat32:
			return wrap(math.Float32frombits(v))
		}
		return wrap(v)
	case ValueUint64, ValueInt64, ValueFloat64:
		var v uint64
		v, err = h.u64(t.String())
		switch t {
		case ValueInt64:
			return wrap(int64(v))
		case ValueFloat64:
			return wrap(math.Float64frombits(v))
		}
		return wrap(v)
	case ValueString:
		var s string
		s, err = h.str("string value")
		return wrap(s)
	}
	return nil, h.errAt(at, key, "", ErrValueType, "type %s", t)
}

func (h *hdr) array(t ValueType, n int, key string) (any, error) {
	switch t {
	case ValueString:
		return h.strings(n, key)
	case ValueBool:
		raw := make([]byte, n)
		if err := h.read(raw, "BOOL array"); err != nil {
			return nil, keyed(err, key)
		}
		out := make([]bool, n)
		for i, b := range raw {
			if b > 1 {
				return nil, h.errAt(h.pos-int64(n)+int64(i), key, "", ErrValueType, "BOOL byte %d at index %d", b, i)
			}
			out[i] = b == 1
		}
		return out, nil
	}
	raw := make([]byte, int64(n)*t.size())
	if err := h.read(raw, t.String()+" array"); err != nil {
		return nil, keyed(err, key)
	}
	le := binary.LittleEndian
	switch t {
	case ValueUint8:
		return raw, nil
	case ValueInt8:
		out := make([]int8, n)
		for i := range out {
			out[i] = int8(raw[i])
		}
		return out, nil
	case ValueUint16:
		out := make([]uint16, n)
		for i := range out {
			out[i] = le.Uint16(raw[2*i:])
		}
		return out, nil
	case ValueInt16:
		out := make([]int16, n)
		for i := range out {
			out[i] = int16(le.Uint16(raw[2*i:]))
		}
		return out, nil
	case ValueUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = le.Uint32(raw[4*i:])
		}
		return out, nil
	case ValueInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(le.Uint32(raw[4*i:]))
		}
		return out, nil
	case ValueFloat32:
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
		return out, nil
	case ValueUint64:
		out := make([]uint64, n)
		for i := range out {
			out[i] = le.Uint64(raw[8*i:])
		}
		return out, nil
	case ValueInt64:
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(le.Uint64(raw[8*i:]))
		}
		return out, nil
	case ValueFloat64:
		out := make([]float64, n)
		for i := range out {
			out[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
		return out, nil
	}
	return nil, fmt.Errorf("gguf: array of %s", t)
}

// strings reads n strings, their bytes packed into shared arenas (a
// 248320-token vocabulary is one allocation per MiB, not one per token).
func (h *hdr) strings(n int, key string) ([]string, error) {
	out := make([]string, 0, min(n, 1<<16))
	var arena []byte
	for i := 0; i < n; i++ {
		at := h.pos
		if err := h.read(h.scr[:8], "array string length"); err != nil {
			return nil, keyed(err, fmt.Sprintf("%s[%d]", key, i))
		}
		l := binary.LittleEndian.Uint64(h.scr[:8])
		switch {
		case l > MaxStringLen:
			return nil, h.errAt(at, fmt.Sprintf("%s[%d]", key, i), "", ErrTooLarge, "string length %d over the %d limit", l, MaxStringLen)
		case int64(l) > h.left():
			return nil, h.errAt(at, fmt.Sprintf("%s[%d]", key, i), "", ErrTruncated, "string length %d but only %d bytes left", l, h.left())
		case int64(l) > h.budget:
			return nil, h.errAt(at, key, "", ErrTooLarge, "header strings and arrays over %d bytes", int64(maxHeaderBytes))
		}
		h.budget -= int64(l)
		if l == 0 {
			out = append(out, "")
			continue
		}
		if uint64(cap(arena)-len(arena)) < l {
			arena = make([]byte, 0, max(int(min(1<<20, h.left())), int(l)))
		}
		b := arena[len(arena) : len(arena)+int(l)]
		if err := h.read(b, "array string"); err != nil {
			return nil, keyed(err, fmt.Sprintf("%s[%d]", key, i))
		}
		arena = arena[:len(arena)+int(l)]
		out = append(out, unsafe.String(&b[0], len(b))) // b is never written again
	}
	return out, nil
}

func keyed(err error, key string) error {
	var ge *Error
	if errors.As(err, &ge) && ge.Key == "" {
		ge.Key = key
	}
	return err
}
