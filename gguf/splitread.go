package gguf

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
)

// Part is one file of a split that File reads.
type Part struct {
	Path       string
	Size       int64
	DataOffset int64
	// First is the index in File.Tensors of the part's first tensor,
	// Tensors how many it holds.
	First, Tensors int
}

// IsSplit reports whether f is read from the parts of a split.
func (f *File) IsSplit() bool { return len(f.Parts) > 0 }

// Files are the files f is read from: its own path, or every part's.
func (f *File) Files() []string {
	if !f.IsSplit() {
		return []string{f.Path}
	}
	ps := make([]string, len(f.Parts))
	for k, p := range f.Parts {
		ps[k] = p.Path
	}
	return ps
}

// Locate is the file holding tensor t and the absolute offset of its
// bytes there: for a split, its part's (error messages name that file).
func (f *File) Locate(t TensorInfo) (path string, off int64) {
	if sr, ok := f.r.(*splitReader); ok {
		if i, ok := f.tIndex[t.Name]; ok {
			l := sr.loc[i]
			return f.Parts[l.part].Path, l.off
		}
	}
	return f.Path, f.DataOffset + int64(t.Offset)
}

// splitKeys are the metadata of a part: its number, the number of parts
// and the tensors of all parts.
func splitKeys(f *File) (no, count, total uint64, ok bool, err error) {
	if _, ok := f.KV(KeySplitCount); !ok {
		return 0, 0, 0, false, nil
	}
	get := func(key string, max uint64) (uint64, error) {
		kv, ok := f.KV(key)
		if !ok {
			return 0, &Error{Path: f.Path, Key: key, Offset: -1, Err: fmt.Errorf("%w: %s is set but %s is missing", ErrSplit, KeySplitCount, key)}
		}
		v, ok := kv.Uint()
		if !ok || v > max {
			return 0, &Error{Path: f.Path, Key: key, Offset: -1, Err: fmt.Errorf("%w: %v (%s) is not a valid value", ErrSplit, kv.Value, kv.Type)}
		}
		return v, nil
	}
	if count, err = get(KeySplitCount, MaxSplitParts); err != nil {
		return
	}
	if no, err = get(KeySplitNo, MaxSplitParts); err != nil {
		return
	}
	if total, err = get(KeySplitTensors, MaxTensors); err != nil {
		return
	}
	if count == 0 || no >= count {
		err = &Error{Path: f.Path, Key: KeySplitNo, Offset: -1, Err: fmt.Errorf("%w: part %d of %d", ErrSplit, no, count)}
	}
	return no, count, total, true, err
}

// OpenSplit turns f, opened with OpenFile, into the whole model when it is
// the first part of a split: the other parts are opened beside it (named
// as llama.cpp names them, SplitName) and checked to belong to it (the
// same split.count and split.tensors.count, the right split.no, the
// tensors adding up, no tensor twice); a missing or foreign part is an
// *Error naming that file. The File returned reads the model as one file
// made of the parts would be: the first part's KVs without the split.*
// keys, every tensor in order at that file's offsets. f without split
// keys is returned as it is; a later part of a split is refused, naming
// the first. OpenSplit owns f: on error it closes it.
func OpenSplit(f *File) (*File, error) {
	no, count, total, ok, err := splitKeys(f)
	if !ok || err != nil {
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	prefix, pno, pcount, named := ParseSplitName(f.Path)
	if no != 0 {
		f.Close()
		msg := fmt.Sprintf("part %d of %d of a split GGUF: open its first part", no+1, count)
		if named && pcount == int(count) {
			msg += ", " + filepath.Base(SplitName(prefix, 0, pcount))
		}
		return nil, &Error{Path: f.Path, Key: KeySplitNo, Offset: -1, Err: fmt.Errorf("%w: %s", ErrSplit, msg)}
	}
	if count > 1 && (!named || pno != 0 || pcount != int(count)) {
		f.Close()
		return nil, &Error{Path: f.Path, Offset: -1, Err: fmt.Errorf("%w: the first of %d parts must be named PREFIX-00001-of-%05d.gguf to find the others, as llama.cpp finds them", ErrSplit, count, count)}
	}
	parts := []*File{f}
	closeAll := func() {
		for _, p := range parts {
			p.Close()
		}
	}
	for k := 1; k < int(count); k++ {
		path := SplitName(prefix, k, int(count))
		p, err := OpenFile(path)
		if err != nil {
			closeAll()
			if errors.Is(err, fs.ErrNotExist) {
				return nil, &Error{Path: path, Offset: -1, Err: fmt.Errorf("%w: part %d of %d is missing (the split's first part is %s)", ErrSplit, k+1, count, filepath.Base(f.Path))}
			}
			return nil, err
		}
		parts = append(parts, p)
		pn, pc, pt, ok, err := splitKeys(p)
		switch {
		case err != nil:
			closeAll()
			return nil, err
		case !ok:
			closeAll()
			return nil, &Error{Path: path, Key: KeySplitCount, Offset: -1, Err: fmt.Errorf("%w: not a part of a split (no %s), but named as part %d of %d", ErrSplit, KeySplitCount, k+1, count)}
		case pc != count:
			closeAll()
			return nil, &Error{Path: path, Key: KeySplitCount, Offset: -1, Err: fmt.Errorf("%w: a part of a split in %d parts, not of the %d of %s", ErrSplit, pc, count, filepath.Base(f.Path))}
		case pn != uint64(k):
			closeAll()
			return nil, &Error{Path: path, Key: KeySplitNo, Offset: -1, Err: fmt.Errorf("%w: holds part %d, named as part %d", ErrSplit, pn+1, k+1)}
		case pt != total:
			closeAll()
			return nil, &Error{Path: path, Key: KeySplitTensors, Offset: -1, Err: fmt.Errorf("%w: a part of a split of %d tensors, not of the %d of %s", ErrSplit, pt, total, filepath.Base(f.Path))}
		}
	}
	n := 0
	for _, p := range parts {
		n += len(p.Tensors)
	}
	if uint64(n) != total {
		closeAll()
		return nil, &Error{Path: f.Path, Key: KeySplitTensors, Offset: -1, Err: fmt.Errorf("%w: the %d parts hold %d tensors, %s says %d", ErrSplit, count, n, KeySplitTensors, total)}
	}
	var kvs []KV
	for _, kv := range f.KVs {
		if kv.Key != KeySplitNo && kv.Key != KeySplitCount && kv.Key != KeySplitTensors {
			kvs = append(kvs, kv)
		}
	}
	specs := make([]TensorSpec, 0, n)
	sr := &splitReader{loc: make([]splitLoc, 0, n)}
	seen := map[string]string{}
	m := &File{Path: f.Path, Version: f.Version, KVs: kvs, Alignment: f.Alignment, HeaderRead: f.HeaderRead, r: sr,
		kvIndex: map[string]int{}, tIndex: map[string]int{}}
	for k, p := range parts {
		m.Parts = append(m.Parts, Part{Path: p.Path, Size: p.Size, DataOffset: p.DataOffset, First: len(specs), Tensors: len(p.Tensors)})
		for _, t := range p.Tensors {
			if other, dup := seen[t.Name]; dup {
				closeAll()
				return nil, &Error{Path: p.Path, Tensor: t.Name, Offset: -1, Err: fmt.Errorf("%w: %w: also in %s", ErrSplit, ErrDuplicateTensor, filepath.Base(other))}
			}
			seen[t.Name] = p.Path
			specs = append(specs, TensorSpec{Name: t.Name, Dims: t.Dims, Type: t.Type})
			sr.loc = append(sr.loc, splitLoc{part: k, r: p.r, off: p.DataOffset + int64(t.Offset)})
		}
	}
	l, err := PlanLayout(kvs, specs, f.Alignment)
	if err != nil {
		closeAll()
		return nil, &Error{Path: f.Path, Offset: -1, Err: fmt.Errorf("%w: %w", ErrSplit, err)}
	}
	sr.ReaderAt = l.Reader(sr.tensorBytes)
	m.Tensors, m.DataOffset, m.Size = l.Tensors, l.DataOffset, l.Size
	for i, kv := range m.KVs {
		m.kvIndex[kv.Key] = i
	}
	for i, t := range m.Tensors {
		m.tIndex[t.Name] = i
	}
	m.closer = multiCloser(parts)
	return m, nil
}

type multiCloser []*File

func (mc multiCloser) Close() error {
	var err error
	for _, f := range mc {
		err = errors.Join(err, f.Close())
	}
	return err
}

type splitLoc struct {
	part int
	r    io.ReaderAt
	off  int64 // absolute offset of the tensor's bytes in its part
}

// splitReader reads the whole file a split's parts make: its header from
// the layout, each tensor's bytes from its part, zeros for the padding.
type splitReader struct {
	io.ReaderAt // layout.Reader(tensorBytes)
	loc         []splitLoc
}

func (r *splitReader) tensorBytes(i int, b []byte, off int64) (int, error) {
	n, err := r.loc[i].r.ReadAt(b, r.loc[i].off+off)
	if err == io.EOF && n == len(b) {
		err = nil
	}
	return n, err
}
