package convert

import (
	"fmt"
	"io"
	"sort"
	"sync"
)

// ReaderAt is the file Write would make from p, made on demand: reading a
// range of it converts just the checkpoint rows under that range, with
// the same code Write runs (convertUnit), so the bytes are Write's, F16
// rounding included. The quantizer reads a checkpoint through it as if it
// were the converted GGUF, without that file ever being written
// (gguf/quantize.OpenSource). It is safe for concurrent use; each call
// holds about the rows it covers (and their float32 values while a
// transform runs). The checkpoint p was planned from must stay open.
func (p *Plan) ReaderAt() io.ReaderAt {
	return &planReader{p: p, pool: sync.Pool{New: func() any { return new(buffers) }}}
}

type planReader struct {
	p    *Plan
	pool sync.Pool
}

func (r *planReader) ReadAt(b []byte, off int64) (int, error) {
	l := r.p.Layout
	if off < 0 {
		return 0, fmt.Errorf("%s: converted GGUF: negative offset %d", r.p.Dir, off)
	}
	n := 0
	for n < len(b) {
		pos := off + int64(n)
		if pos >= l.Size {
			return n, io.EOF
		}
		if pos < l.DataOffset {
			n += copy(b[n:], l.Header[pos:])
			continue
		}
		// The tensor holding pos, or the padding after it.
		i := sort.Search(len(l.Tensors), func(i int) bool { return l.TensorOffset(i) > pos }) - 1
		if i < 0 {
			return n, fmt.Errorf("%s: converted GGUF: internal layout error at offset %d", r.p.Dir, pos)
		}
		start := l.TensorOffset(i)
		end := start + l.Tensors[i].Size()
		if pos >= end { // padding: zeros up to the next tensor (or the end)
			next := l.Size
			if i+1 < len(l.Tensors) {
				next = l.TensorOffset(i + 1)
			}
			m := min(int64(len(b)-n), next-pos)
			clear(b[n : n+int(m)])
			n += int(m)
			continue
		}
		m, err := r.tensorBytes(i, b[n:min(int64(len(b)), int64(n)+end-pos)], pos-start)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// tensorBytes fills dst with tensor i's bytes from byte at of the tensor,
// converting the rows that cover them.
func (r *planReader) tensorBytes(i int, dst []byte, at int64) (int, error) {
	t := &r.p.Tensors[i]
	rowBytes, _ := t.Type.RowSize(uint64(t.vt.cols()))
	rb := int64(rowBytes)
	if rb == 0 {
		return 0, fmt.Errorf("%s: tensor %q: internal plan error: empty rows", r.p.Dir, t.Name)
	}
	u := unit{T: i, R0: at / rb, R1: (at + int64(len(dst)) + rb - 1) / rb}
	return r.convert(u, dst, at-u.R0*rb)
}

// convert converts unit u and copies its bytes from skip on into dst.
func (r *planReader) convert(u unit, dst []byte, skip int64) (int, error) {
	b := r.pool.Get().(*buffers)
	defer r.pool.Put(b)
	if _, _, _, err := convertUnit(r.p, u, b); err != nil {
		return 0, err
	}
	return copy(dst, b.out[skip:]), nil
}
