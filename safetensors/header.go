package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"unicode/utf8"

	"github.com/ferry-llm/ferry/tensor"
)

// MaxHeaderSize is the reference parser's limit (MAX_HEADER_SIZE).
const MaxHeaderSize = 100_000_000

// TensorInfo describes one tensor of a file. Begin and End are relative to
// the data section (file offset DataOffset); End is exclusive.
type TensorInfo struct {
	Name  string
	DType tensor.DType
	Shape []int64
	Begin int64
	End   int64
}

// Size is the tensor's byte length.
func (t TensorInfo) Size() int64 { return t.End - t.Begin }

// NumElements is the product of the shape.
func (t TensorInfo) NumElements() int64 {
	n, _ := tensor.NumElements(t.Shape)
	return n
}

// File is a parsed, validated safetensors file.
type File struct {
	Path       string
	Size       int64
	HeaderSize int64 // N, the JSON length including padding
	Metadata   map[string]string
	Tensors    []TensorInfo // in data-offset order

	r      io.ReaderAt
	closer io.Closer
	byName map[string]int
}

// DataOffset is the absolute file offset of the data section.
func (f *File) DataOffset() int64 { return 8 + f.HeaderSize }

// Tensor looks a tensor up by name.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Tensors[i], true
}

// Section returns a reader over exactly t's bytes.
func (f *File) Section(t TensorInfo) *io.SectionReader {
	return io.NewSectionReader(f.r, f.DataOffset()+t.Begin, t.Size())
}

// ReaderAt is the underlying reader.
func (f *File) ReaderAt() io.ReaderAt { return f.r }

// Close closes the underlying file if Open opened it.
func (f *File) Close() error {
	if f.closer != nil {
		return f.closer.Close()
	}
	return nil
}

// Open opens and validates the safetensors file at path.
func Open(path string) (*File, error) {
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

// rawTensor is one header entry. Pointers everywhere: encoding/json reads
// null into a string or int64 as "leave it alone", so a null would pass as
// "" or 0; the reference parser (serde) rejects it, and so do we.
type rawTensor struct {
	DType       *string   `json:"dtype"`
	Shape       *[]*int64 `json:"shape"`
	DataOffsets *[]*int64 `json:"data_offsets"`
}

// ints unwraps a decoded integer list, reporting whether any was null.
func ints(p []*int64) ([]int64, bool) {
	out := make([]int64, len(p))
	for i, v := range p {
		if v == nil {
			return nil, false
		}
		out[i] = *v
	}
	return out, true
}

// Parse reads and validates the header of the safetensors file behind r,
// which is size bytes long, with the reference parser's rules. path is used
// in errors only.
func Parse(r io.ReaderAt, size int64, path string) (*File, error) {
	if size < 8 {
		return nil, errf(path, "", 0, ErrTruncated, "%d bytes, need at least 8 for the header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, errf(path, "", 0, ErrTruncated, "reading header length: %v", err)
	}
	n64 := binary.LittleEndian.Uint64(lenBuf[:])
	if n64 > MaxHeaderSize {
		return nil, errf(path, "", 0, ErrHeaderTooLarge, "header length %d", n64)
	}
	n := int64(n64)
	if n > size-8 {
		return nil, errf(path, "", 0, ErrHeaderLength, "header length %d but only %d bytes follow", n, size-8)
	}
	hdr := make([]byte, n)
	if _, err := r.ReadAt(hdr, 8); err != nil {
		return nil, errf(path, "", 8, ErrTruncated, "reading header: %v", err)
	}
	f := &File{Path: path, Size: size, HeaderSize: n, r: r}
	if err := f.parseHeader(hdr); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *File) parseHeader(hdr []byte) error {
	path := f.Path
	if !utf8.Valid(hdr) {
		return errf(path, "", 8, ErrInvalidHeader, "header is not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	bad := func(err error) error {
		off := int64(8) + dec.InputOffset()
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off = 8 + se.Offset
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errors.New("JSON ends before the header object is complete")
		}
		return errf(path, "", off, ErrInvalidHeader, "%v", err)
	}
	tok, err := dec.Token()
	if err != nil {
		return bad(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errf(path, "", 8, ErrInvalidHeader, "header is not a JSON object")
	}
	seen := map[string]bool{}
	f.byName = map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		key := tok.(string) // object keys are always strings
		keyOff := 8 + dec.InputOffset()
		if seen[key] {
			if key == "__metadata__" {
				return errf(path, "", keyOff, ErrInvalidHeader, "__metadata__ appears twice")
			}
			return errf(path, key, keyOff, ErrDuplicateTensor, "")
		}
		seen[key] = true
		if key == "__metadata__" {
			var md map[string]*string
			if err := dec.Decode(&md); err != nil {
				return errf(path, "", keyOff, ErrInvalidHeader, "__metadata__ must map strings to strings: %v", err)
			}
			if md != nil {
				f.Metadata = make(map[string]string, len(md))
			}
			for k, v := range md {
				if v == nil {
					return errf(path, "", keyOff, ErrInvalidHeader, "__metadata__ must map strings to strings: %q is null", k)
				}
				f.Metadata[k] = *v
			}
			continue
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return errf(path, key, keyOff, ErrInvalidHeader, "%v", err)
		}
		rt, err := decodeEntry(raw)
		if err != nil {
			return errf(path, key, keyOff, ErrInvalidHeader, "%v", err)
		}
		if rt.DType == nil || rt.Shape == nil || rt.DataOffsets == nil {
			return errf(path, key, keyOff, ErrInvalidHeader, "entry needs dtype, shape and data_offsets")
		}
		shape, ok := ints(*rt.Shape)
		if !ok {
			return errf(path, key, keyOff, ErrInvalidHeader, "null in shape")
		}
		offsets, ok := ints(*rt.DataOffsets)
		if !ok {
			return errf(path, key, keyOff, ErrInvalidOffset, "null in data_offsets")
		}
		dt := tensor.DType(*rt.DType)
		if !dt.Known() {
			return errf(path, key, keyOff, ErrUnknownDType, "%q", *rt.DType)
		}
		if len(offsets) != 2 {
			return errf(path, key, keyOff, ErrInvalidOffset, "data_offsets has %d values, want 2", len(offsets))
		}
		for _, s := range shape {
			if s < 0 {
				return errf(path, key, keyOff, ErrInvalidHeader, "negative dimension in shape %v", shape)
			}
		}
		t := TensorInfo{Name: key, DType: dt, Shape: shape, Begin: offsets[0], End: offsets[1]}
		if t.Begin < 0 || t.End < t.Begin {
			return errf(path, key, keyOff, ErrInvalidOffset, "data_offsets [%d, %d]", t.Begin, t.End)
		}
		f.Tensors = append(f.Tensors, t)
	}
	if _, err := dec.Token(); err != nil { // closing brace
		return bad(err)
	}
	// Only JSON whitespace may follow (writers pad with spaces).
	rest := hdr[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return errf(path, "", 8+dec.InputOffset(), ErrInvalidHeader, "data after the header object")
	}

	sort.SliceStable(f.Tensors, func(i, j int) bool {
		a, b := f.Tensors[i], f.Tensors[j]
		if a.Begin != b.Begin {
			return a.Begin < b.Begin
		}
		return a.End < b.End
	})
	data := f.DataOffset()
	var end int64
	for i, t := range f.Tensors {
		want, err := tensor.ByteSize(t.DType, t.Shape)
		if err != nil {
			return errf(path, t.Name, data+t.Begin, ErrSizeMismatch, "%v", err)
		}
		if t.Begin != end {
			if t.Begin < end {
				return errf(path, t.Name, data+t.Begin, ErrOverlap, "data_offsets [%d, %d] overlap the previous tensor, which ends at %d", t.Begin, t.End, end)
			}
			return errf(path, t.Name, data+t.Begin, ErrGap, "data_offsets [%d, %d] leave a gap after the previous tensor, which ends at %d", t.Begin, t.End, end)
		}
		if t.Size() != want {
			return errf(path, t.Name, data+t.Begin, ErrSizeMismatch, "%d bytes for %s %v, want %d", t.Size(), t.DType, t.Shape, want)
		}
		end = t.End
		f.byName[t.Name] = i
	}
	if end > f.Size-data {
		last := f.Tensors[len(f.Tensors)-1]
		return errf(path, last.Name, data+last.Begin, ErrTruncated, "data ends at %d but the file has %d bytes", data+end, f.Size)
	}
	if data+end != f.Size {
		return errf(path, "", data+end, ErrTrailingBytes, "%d extra bytes (the tensors end at %d, the file at %d)", f.Size-data-end, data+end, f.Size)
	}
	return nil
}

// decodeEntry decodes one tensor entry the way serde does: field names
// match exactly (encoding/json would also take "DType" or "Shape"), a
// field given twice is an error (encoding/json would keep the last), and
// unknown fields are ignored. raw is already known to be valid JSON.
func decodeEntry(raw []byte) (rawTensor, error) {
	var rt rawTensor
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return rt, errors.New("entry is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return rt, err
		}
		k, _ := tok.(string)
		if seen[k] {
			return rt, fmt.Errorf("field %q appears twice", k)
		}
		seen[k] = true
		var dst any
		switch k {
		case "dtype":
			dst = &rt.DType
		case "shape":
			dst = &rt.Shape
		case "data_offsets":
			dst = &rt.DataOffsets
		default:
			dst = new(json.RawMessage)
		}
		if err := dec.Decode(dst); err != nil {
			return rt, fmt.Errorf("%s: %v", k, err)
		}
	}
	return rt, nil
}
