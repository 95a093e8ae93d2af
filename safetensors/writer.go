package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/tensor"
)

// TensorSpec declares a tensor to be written.
type TensorSpec struct {
	Name  string
	DType tensor.DType
	Shape []int64
}

// Size is the spec's byte length (0 if the shape is invalid).
func (s TensorSpec) Size() int64 {
	n, _ := tensor.ByteSize(s.DType, s.Shape)
	return n
}

// SortReference orders specs as the reference writer does: by dtype in
// descending enum order, then by name.
func SortReference(specs []TensorSpec) {
	sort.SliceStable(specs, func(i, j int) bool {
		a, b := specs[i], specs[j]
		if a.DType.Order() != b.DType.Order() {
			return a.DType.Order() > b.DType.Order()
		}
		return a.Name < b.Name
	})
}

// EncodeHeader lays the tensors out contiguously in the given order and
// returns the 8-byte length prefix plus the JSON header, padded with spaces
// so the data section starts at a multiple of 8, and the resulting infos.
//
// The bytes are those safetensors 0.8.0 writes for the same tensor order
// (checked against every reference file in testdata): compact JSON,
// __metadata__ first with its keys sorted, then each tensor as
// {"dtype","shape","data_offsets"}, strings escaped as serde_json does.
// For the reference order, sort the specs with SortReference first.
func EncodeHeader(metadata map[string]string, specs []TensorSpec) ([]byte, []TensorInfo, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	comma := func() {
		if !first {
			b.WriteByte(',')
		}
		first = false
	}
	enc := func(v any) {
		switch v := v.(type) {
		case string:
			b.Write(appendJSONString(nil, v))
		case []int64:
			b.WriteByte('[')
			for i, d := range v {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString(strconv.FormatInt(d, 10))
			}
			b.WriteByte(']')
		}
	}
	if len(metadata) > 0 {
		comma()
		b.WriteString(`"__metadata__":{`)
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			enc(k)
			b.WriteByte(':')
			enc(metadata[k])
		}
		b.WriteByte('}')
	}
	infos := make([]TensorInfo, len(specs))
	seen := make(map[string]bool, len(specs))
	var off int64
	for i, s := range specs {
		if s.Name == "__metadata__" {
			return nil, nil, fmt.Errorf("tensor name %q is reserved", s.Name)
		}
		if seen[s.Name] {
			return nil, nil, fmt.Errorf("tensor %q: %w", s.Name, ErrDuplicateTensor)
		}
		seen[s.Name] = true
		size, err := tensor.ByteSize(s.DType, s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", s.Name, err)
		}
		shape := s.Shape
		if shape == nil {
			shape = []int64{}
		}
		infos[i] = TensorInfo{Name: s.Name, DType: s.DType, Shape: shape, Begin: off, End: off + size}
		comma()
		enc(s.Name)
		b.WriteString(`:{"dtype":`)
		enc(string(s.DType))
		b.WriteString(`,"shape":`)
		enc(shape)
		fmt.Fprintf(&b, `,"data_offsets":[%d,%d]}`, off, off+size)
		off += size
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	if b.Len() > MaxHeaderSize {
		return nil, nil, fmt.Errorf("header of %d bytes: %w", b.Len(), ErrHeaderTooLarge)
	}
	out := make([]byte, 8, 8+b.Len())
	binary.LittleEndian.PutUint64(out, uint64(b.Len()))
	return append(out, b.Bytes()...), infos, nil
}

// Writer writes one safetensors file: the header first, then tensor bodies
// streamed in declared order. Made by Create, the file appears under its
// final name only when Close succeeds; Abort (or a crash) leaves nothing
// under that name, and the bytes are hashed as they are written (Sum).
// Made by NewWriter or ResumeWriter, it writes to a stream the caller owns
// (a resumable partial file) and only checks the layout. Errors are sticky.
type Writer struct {
	name    string             // the file, for messages
	dst     io.Writer          // where header and bodies go
	af      *fsutil.AtomicFile // Create only
	hw      *hashing.Writer    // Create only
	bw      *bufio.Writer      // Create only
	tensors []TensorInfo
	cur     int   // index of the next tensor not fully written
	inCur   int64 // bytes of it written so far
	last    int   // index of the last tensor with bytes, or -1
	err     error
}

// Create starts writing path with the given tensors, in the given order.
func Create(path string, metadata map[string]string, specs []TensorSpec) (*Writer, error) {
	hdr, infos, err := EncodeHeader(metadata, specs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	af, err := fsutil.CreateAtomic(path)
	if err != nil {
		return nil, err
	}
	hw := hashing.NewWriter(af)
	bw := bufio.NewWriterSize(hw, 1<<20)
	w := newWriter(path, bw, infos)
	w.af, w.hw, w.bw = af, hw, bw
	if _, err := w.bw.Write(hdr); err != nil {
		af.Abort()
		return nil, err
	}
	return w, nil
}

// NewWriter writes the header of the given tensors to dst and returns a
// Writer for their bodies; name is the file, for messages.
func NewWriter(dst io.Writer, name string, metadata map[string]string, specs []TensorSpec) (*Writer, error) {
	return ResumeWriter(dst, name, metadata, specs, 0)
}

// ResumeWriter continues a file of which written bytes (counted from the
// file's first byte) are already in dst: from the header, or from inside
// the bodies, where the Writer then expects the rest of the tensor that
// byte falls in. Position says where that is. written 0 writes the header.
func ResumeWriter(dst io.Writer, name string, metadata map[string]string, specs []TensorSpec, written int64) (*Writer, error) {
	hdr, infos, err := EncodeHeader(metadata, specs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	w := newWriter(name, dst, infos)
	if written == 0 {
		if _, err := dst.Write(hdr); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return w, nil
	}
	pos := written - int64(len(hdr))
	var total int64
	if len(infos) > 0 {
		total = infos[len(infos)-1].End
	}
	if pos < 0 || pos > total {
		return nil, fmt.Errorf("%s: %w: resuming at byte %d, outside the bodies (%d header bytes, %d body bytes)", name, ErrWriteSize, written, len(hdr), total)
	}
	for w.cur < len(w.tensors) && w.tensors[w.cur].End <= pos && (w.tensors[w.cur].Size() > 0 || w.tensors[w.cur].End < pos) {
		w.cur++
	}
	if w.cur < len(w.tensors) {
		w.inCur = pos - w.tensors[w.cur].Begin
	}
	return w, nil
}

func newWriter(name string, dst io.Writer, infos []TensorInfo) *Writer {
	w := &Writer{name: name, dst: dst, tensors: infos, last: -1}
	for i, t := range infos {
		if t.Size() != 0 {
			w.last = i
		}
	}
	return w
}

// Position is the next tensor to write (its index in the declared order;
// len(Tensors()) when every byte is written) and how many of its bytes
// are already written.
func (w *Writer) Position() (int, int64) { return w.cur, w.inCur }

// Tensors returns the planned layout.
func (w *Writer) Tensors() []TensorInfo { return w.tensors }

// Write appends tensor body bytes in declared order, crossing tensor
// boundaries freely (zero-size tensors take no bytes); it fails if p runs
// past the last declared byte.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	written := 0
	for len(p) > 0 {
		for w.cur < len(w.tensors) && w.inCur == w.tensors[w.cur].Size() {
			w.cur++
			w.inCur = 0
		}
		if w.cur >= len(w.tensors) {
			w.err = fmt.Errorf("%s: %w: %d bytes past the last tensor", w.name, ErrWriteSize, len(p))
			return written, w.err
		}
		room := w.tensors[w.cur].Size() - w.inCur
		chunk := p
		if int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		n, err := w.dst.Write(chunk)
		written += n
		w.inCur += int64(n)
		if err != nil {
			w.err = err
			return written, err
		}
		p = p[n:]
		if w.inCur == w.tensors[w.cur].Size() {
			w.cur++
			w.inCur = 0
		}
	}
	return written, nil
}

// Next is the name of the next tensor not yet written (it may be a
// zero-size one), or "" when every tensor is written.
func (w *Writer) Next() string {
	if w.cur >= len(w.tensors) {
		return ""
	}
	return w.tensors[w.cur].Name
}

// Done reports whether every declared byte has been written; only
// zero-size tensors, if any, remain.
func (w *Writer) Done() bool { return w.cur > w.last } // Write moves cur past a finished tensor

// WriteTensor copies exactly the named tensor's bytes from r. name must be
// the next tensor in declared order; zero-size tensors before it may be
// skipped (they hold no bytes).
func (w *Writer) WriteTensor(name string, r io.Reader) error {
	if w.err != nil {
		return w.err
	}
	if w.inCur == 0 {
		for w.cur < len(w.tensors) && w.tensors[w.cur].Name != name && w.tensors[w.cur].Size() == 0 {
			w.cur++
		}
	}
	if w.inCur != 0 || w.Next() != name {
		w.err = fmt.Errorf("%s: tensor %q: %w (next is %q)", w.name, name, ErrWriteOrder, w.Next())
		return w.err
	}
	size := w.tensors[w.cur].Size()
	if size == 0 {
		w.cur++
		return nil
	}
	n, err := io.CopyN(w, r, size)
	if err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("%s: tensor %q: copied %d of %d bytes: %w", w.name, name, n, size, err)
		}
		return w.err
	}
	return nil
}

// Close checks that every declared byte was written; made by Create, it
// then flushes, fsyncs and renames the file into place.
func (w *Writer) Close() error {
	if w.err != nil {
		w.Abort()
		return w.err
	}
	if !w.Done() {
		w.err = fmt.Errorf("%s: %w: tensor %q incomplete (%d of %d bytes)", w.name, ErrWriteSize, w.tensors[w.cur].Name, w.inCur, w.tensors[w.cur].Size())
		w.Abort()
		return w.err
	}
	w.err = fmt.Errorf("%s: writer closed", w.name)
	if w.af == nil {
		return nil
	}
	if err := w.bw.Flush(); err != nil {
		w.err = err
		w.af.Abort()
		return err
	}
	return w.af.Commit()
}

// Sum is the sha256 and size of a file made by Create; after a successful
// Close, those of the committed file.
func (w *Writer) Sum() (hashing.Digest, int64) { return w.hw.Sum(), w.hw.Size() }

// Abort discards a file made by Create; a stream's bytes stay with its
// owner.
func (w *Writer) Abort() {
	if w.err == nil {
		w.err = fmt.Errorf("%s: writer aborted", w.name)
	}
	if w.af != nil {
		w.af.Abort()
	}
}

// appendJSONString quotes s as serde_json does: '"' and '\\' escaped, the
// control characters U+0000–U+001F as \b \f \n \r \t or \u00xx, and
// everything else (including U+2028/U+2029, which encoding/json would
// escape) written as is. Invalid UTF-8 becomes U+FFFD, as Rust strings
// cannot hold it.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, "\ufffd"...)
			} else {
				dst = append(dst, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\b':
			dst = append(dst, '\\', 'b')
		case c == '\f':
			dst = append(dst, '\\', 'f')
		case c == '\n':
			dst = append(dst, '\\', 'n')
		case c == '\r':
			dst = append(dst, '\\', 'r')
		case c == '\t':
			dst = append(dst, '\\', 't')
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}
