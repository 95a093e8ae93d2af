package convert

import (
	"fmt"
	"io"
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
	r := &planReader{p: p, pool: sync.Pool{New: func() any { return new(buffers) }}}
	return p.Layout.Reader(r.tensorBytes)
}

type planReader struct {
	p    *Plan
	pool sync.Pool
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
