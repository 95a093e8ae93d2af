package gguf

import (
	"fmt"
	"io"
	"sort"
)

// TensorBytes fills b with tensor i's bytes from byte off of the tensor on
// (b never reaches past the tensor's end).
type TensorBytes func(i int, b []byte, off int64) (int, error)

// Reader is the file l describes, made on demand: its header from l, each
// tensor's bytes from tensor, zeros for the padding. It is how a file
// that is never written is read (a checkpoint read as its conversion, a
// split read as the one file its parts make). It is safe for concurrent
// use when tensor is.
func (l *Layout) Reader(tensor TensorBytes) io.ReaderAt { return &layoutReader{l, tensor} }

type layoutReader struct {
	l      *Layout
	tensor TensorBytes
}

func (r *layoutReader) ReadAt(b []byte, off int64) (int, error) {
	l := r.l
	if off < 0 {
		return 0, fmt.Errorf("gguf: negative offset %d", off)
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
			return n, fmt.Errorf("gguf: internal layout error at offset %d", pos)
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
		m, err := r.tensor(i, b[n:min(int64(len(b)), int64(n)+end-pos)], pos-start)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
