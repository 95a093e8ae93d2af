package imatrix

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// minEntryBytes is the smallest legacy entry: name length, an empty name,
// ncall, nval and one value.
const minEntryBytes = 16

// readLegacy reads the .dat format as common_imatrix_load_legacy and
// load_imatrix do. A later entry of the same name replaces an earlier one,
// names and the dataset end at their first NUL byte (llama.cpp keeps C
// strings), and the trailer is read as far as it goes: a chunk count cut
// short keeps the bytes there are, a dataset that does not fit is left
// out, and bytes after it are ignored.
func readLegacy(r io.ReaderAt, size int64, path string) (*Matrix, error) {
	c := &cursor{r: r, size: size, path: path}
	m := &Matrix{path: path, format: Legacy, entries: map[string][]float32{}}
	n, err := c.i32("entry count", "")
	if err != nil || n < 1 {
		return nil, inputerr.New(path, "", 0, ErrNoData, "entry count %d in a file of %d bytes", n, size)
	}
	if int64(n) > c.left()/minEntryBytes {
		return nil, inputerr.New(path, "", 0, ErrTruncated, "%d entries need at least %d bytes, %d left", n, int64(n)*minEntryBytes, c.left())
	}
	for i := range n {
		at := c.pos
		what := fmt.Sprintf("entry %d", i)
		ln, err := c.i32(what+": name length", "")
		if err != nil {
			return nil, err
		}
		if ln < 0 {
			return nil, inputerr.New(path, "", at, ErrLength, "%s: name length %d", what, ln)
		}
		if int64(ln) > c.left() {
			return nil, inputerr.New(path, "", at, ErrTruncated, "%s: name length %d with %d bytes left", what, ln, c.left())
		}
		b, err := c.bytes(int64(ln), what+": name", "")
		if err != nil {
			return nil, err
		}
		name := cString(string(b))
		ncall, err := c.i32(what+": ncall", name)
		if err != nil {
			return nil, err
		}
		nvalAt := c.pos
		nval, err := c.i32(what+": nval", name)
		if err != nil {
			return nil, err
		}
		if nval < 1 {
			return nil, inputerr.New(path, name, nvalAt, ErrLength, "%s: %d values", what, nval)
		}
		if int64(nval) > c.left()/4 {
			return nil, inputerr.New(path, name, nvalAt, ErrTruncated, "%s: %d values with %d bytes left", what, nval, c.left())
		}
		b, err = c.bytes(4*int64(nval), what+": values", name)
		if err != nil {
			return nil, err
		}
		// load_imatrix's legacy branch: value / ncall in float32 (the
		// int64 ncall converted to float), or the value when ncall ≤ 0.
		v := make([]float32, nval)
		for j := range v {
			v[j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
			if ncall > 0 {
				v[j] /= float32(ncall)
			}
		}
		m.entries[name] = v
	}
	if c.left() == 0 {
		return m, nil
	}
	// The trailer: int32 chunk count, int32 length, the dataset name.
	var cc [4]byte
	k := min(c.left(), 4)
	b, err := c.bytes(k, "chunk count", "")
	if err != nil {
		return nil, err
	}
	copy(cc[:], b) // istream::read keeps a short read's bytes
	m.chunks = int32(binary.LittleEndian.Uint32(cc[:]))
	if k < 4 || c.left() < 4 {
		return m, nil
	}
	ln, err := c.i32("dataset length", "")
	if err != nil {
		return nil, err
	}
	if ln > 0 && int64(ln) <= c.left() {
		b, err := c.bytes(int64(ln), "dataset", "")
		if err != nil {
			return nil, err
		}
		m.datasets = append(m.datasets, cString(string(b)))
	}
	return m, nil
}

// cursor reads a legacy file front to back.
type cursor struct {
	r    io.ReaderAt
	size int64
	pos  int64
	path string
}

func (c *cursor) left() int64 { return c.size - c.pos }

// bytes reads the next n bytes, n ≤ left() (callers check it, so the
// allocation is bounded by the file).
func (c *cursor) bytes(n int64, what, entry string) ([]byte, error) {
	if n > c.left() {
		return nil, inputerr.New(c.path, entry, c.pos, ErrTruncated, "%s: %d bytes, %d left", what, n, c.left())
	}
	b := make([]byte, n)
	if got, err := c.r.ReadAt(b, c.pos); int64(got) < n {
		return nil, inputerr.New(c.path, entry, c.pos, ErrTruncated, "%s: %v", what, err)
	}
	c.pos += n
	return b, nil
}

func (c *cursor) i32(what, entry string) (int32, error) {
	b, err := c.bytes(4, what, entry)
	if err != nil {
		return 0, err
	}
	return int32(binary.LittleEndian.Uint32(b)), nil
}
