package gguf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/cpushare"
	"github.com/ferry-llm/ferry/internal/fsutil"
)

// TensorSpec declares one tensor of a file to be written.
type TensorSpec struct {
	Name string
	Dims []uint64 // ggml order, ne0 first
	Type quant.Type
}

// Layout is a planned GGUF file: the encoded header (KVs, tensor infos and
// the padding up to the data section) and every tensor's offset. It is
// computed before any tensor byte is written.
type Layout struct {
	Header     []byte
	Tensors    []TensorInfo // with Offset relative to DataOffset
	Alignment  uint64
	DataOffset int64 // == len(Header)
	Size       int64 // total file size, the last tensor padded too
	// Split, when set (WithSplit), cuts the file into parts: the fields
	// above still describe the whole file, and a Writer writes the parts.
	Split *Split
}

// TensorOffset is the absolute file offset of tensor i.
func (l *Layout) TensorOffset(i int) int64 { return l.DataOffset + int64(l.Tensors[i].Offset) }

// PlanLayout encodes the header and computes the data layout. Tensors are
// laid out in the given order, each padded with zeros to the alignment, the
// last one too (as gguf-py and llama.cpp write them). alignment 0 means the
// default, 32; any other value must also be given as general.alignment.
func PlanLayout(kvs []KV, tensors []TensorSpec, alignment uint64) (*Layout, error) {
	if alignment == 0 {
		alignment = DefaultAlignment
	}
	if alignment&(alignment-1) != 0 {
		return nil, fmt.Errorf("gguf: alignment %d is not a power of two", alignment)
	}
	seenKey := map[string]bool{}
	var b bytes.Buffer
	le := binary.LittleEndian
	put32 := func(v uint32) { b.Write(le.AppendUint32(nil, v)) }
	put64 := func(v uint64) { b.Write(le.AppendUint64(nil, v)) }
	putStr := func(s string) { put64(uint64(len(s))); b.WriteString(s) }
	put32(Magic)
	put32(Version)
	put64(uint64(len(tensors)))
	put64(uint64(len(kvs)))
	for _, kv := range kvs {
		if seenKey[kv.Key] {
			return nil, fmt.Errorf("gguf: key %q twice", kv.Key)
		}
		seenKey[kv.Key] = true
		if kv.Key == "general.alignment" {
			if a, ok := kv.Value.(uint32); !ok || uint64(a) != alignment {
				return nil, fmt.Errorf("gguf: general.alignment %v does not match the layout's %d", kv.Value, alignment)
			}
		}
		putStr(kv.Key)
		put32(uint32(kv.Type))
		if err := encodeValue(&b, kv.Type, kv.Value); err != nil {
			return nil, fmt.Errorf("gguf: key %q: %w", kv.Key, err)
		}
	}
	if alignment != DefaultAlignment && !seenKey["general.alignment"] {
		return nil, fmt.Errorf("gguf: alignment %d needs a general.alignment key", alignment)
	}
	l := &Layout{Alignment: alignment, Tensors: make([]TensorInfo, len(tensors))}
	seen := map[string]bool{}
	var off uint64
	for i, t := range tensors {
		if t.Name == "" || len(t.Name) >= MaxNameLen {
			return nil, fmt.Errorf("gguf: tensor name %q: must be 1 to %d bytes", t.Name, MaxNameLen-1)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("gguf: tensor %q twice", t.Name)
		}
		seen[t.Name] = true
		if len(t.Dims) > MaxDims {
			return nil, fmt.Errorf("gguf: tensor %q: %d dims, at most %d", t.Name, len(t.Dims), MaxDims)
		}
		ti := TensorInfo{Name: t.Name, Dims: append([]uint64(nil), t.Dims...), Type: t.Type, Offset: off}
		if !t.Type.Known() {
			return nil, fmt.Errorf("gguf: tensor %q: %w %d", t.Name, ErrUnknownType, uint32(t.Type))
		}
		n := ti.Size()
		if n < 0 {
			return nil, fmt.Errorf("gguf: tensor %q: %w (%s, dims %v)", t.Name, ErrBlockSize, t.Type, t.Dims)
		}
		l.Tensors[i] = ti
		putStr(t.Name)
		put32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			put64(d)
		}
		put32(uint32(t.Type))
		put64(off)
		p, _ := alignUp(uint64(n), alignment)
		off += p
	}
	start, _ := alignUp(uint64(b.Len()), alignment)
	b.Write(make([]byte, start-uint64(b.Len())))
	l.Header = b.Bytes()
	l.DataOffset = int64(start)
	l.Size = int64(start + off)
	return l, nil
}

func encodeValue(b *bytes.Buffer, t ValueType, v any) error {
	le := binary.LittleEndian
	bad := func() error { return fmt.Errorf("value %T does not match type %s", v, t) }
	switch t {
	case ValueUint8:
		x, ok := v.(uint8)
		if !ok {
			return bad()
		}
		b.WriteByte(x)
	case ValueInt8:
		x, ok := v.(int8)
		if !ok {
			return bad()
		}
		b.WriteByte(byte(x))
	case ValueBool:
		x, ok := v.(bool)
		if !ok {
			return bad()
		}
		if x {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case ValueUint16:
		x, ok := v.(uint16)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint16(nil, x))
	case ValueInt16:
		x, ok := v.(int16)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint16(nil, uint16(x)))
	case ValueUint32:
		x, ok := v.(uint32)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint32(nil, x))
	case ValueInt32:
		x, ok := v.(int32)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint32(nil, uint32(x)))
	case ValueFloat32:
		x, ok := v.(float32)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint32(nil, math.Float32bits(x)))
	case ValueUint64:
		x, ok := v.(uint64)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint64(nil, x))
	case ValueInt64:
		x, ok := v.(int64)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint64(nil, uint64(x)))
	case ValueFloat64:
		x, ok := v.(float64)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint64(nil, math.Float64bits(x)))
	case ValueString:
		x, ok := v.(string)
		if !ok {
			return bad()
		}
		b.Write(le.AppendUint64(nil, uint64(len(x))))
		b.WriteString(x)
	case ValueArray:
		a, ok := v.(Array)
		if !ok {
			return bad()
		}
		if a.Elem == ValueArray || !a.Elem.Known() {
			return fmt.Errorf("array of %s is not supported", a.Elem)
		}
		b.Write(le.AppendUint32(nil, uint32(a.Elem)))
		b.Write(le.AppendUint64(nil, uint64(a.Len())))
		if err := encodeArray(b, a); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown value type %d", uint32(t))
	}
	return nil
}

func encodeArray(b *bytes.Buffer, a Array) error {
	var err error
	each := func(n int, f func(i int) any) {
		for i := 0; i < n && err == nil; i++ {
			err = encodeValue(b, a.Elem, f(i))
		}
	}
	switch s := a.Values.(type) {
	case []uint8:
		each(len(s), func(i int) any { return s[i] })
	case []int8:
		each(len(s), func(i int) any { return s[i] })
	case []uint16:
		each(len(s), func(i int) any { return s[i] })
	case []int16:
		each(len(s), func(i int) any { return s[i] })
	case []uint32:
		each(len(s), func(i int) any { return s[i] })
	case []int32:
		each(len(s), func(i int) any { return s[i] })
	case []float32:
		each(len(s), func(i int) any { return s[i] })
	case []bool:
		each(len(s), func(i int) any { return s[i] })
	case []string:
		each(len(s), func(i int) any { return s[i] })
	case []uint64:
		each(len(s), func(i int) any { return s[i] })
	case []int64:
		each(len(s), func(i int) any { return s[i] })
	case []float64:
		each(len(s), func(i int) any { return s[i] })
	default:
		return fmt.Errorf("array values of Go type %T", a.Values)
	}
	return err
}

// Writer writes the tensor bodies of a planned layout into a file that
// appears under its final name only when Close succeeds, or, for a layout
// with a Split, into its parts. Tensor bodies may be written concurrently,
// each at its own offset.
//
// Resume: each file is written as its path + ".partial". With
// Options.Resume, existing partial files of the planned sizes whose
// headers are byte-identical to the layout's are reused (all of them, or
// none); the caller then calls Skip for tensors it knows to be complete
// (from its journal, or by hashing Section(i)) and writes the rest.
//
// A split is committed as a whole: every part is fsynced, the first part
// of an earlier split of the same names is removed, then the parts are
// renamed into place last to first, so the first part, the one a reader
// opens, appears last and only beside its own parts; a run killed between
// the renames leaves the first part partial, and a resume takes the
// renamed parts back.
type Writer struct {
	path   string
	layout *Layout
	files  []*wfile
	loc    []tensorLoc // where each tensor goes

	mu      sync.Mutex
	wmu     sync.Mutex // serializes WriteAt's pwrite
	written []bool
	err     error // sticky
	done    bool
	resumed bool
	noSync  bool
	syncs   atomic.Int32 // fsyncs made (files and directory), for tests
}

// wfile is one file a Writer writes: the whole file or one part.
type wfile struct {
	path, tmp string
	layout    *Layout
	f         *os.File
	fl        *fsutil.Writeback // background writeback requests (Linux)
	base      int64             // where the file starts in the files' concatenation
}

type tensorLoc struct {
	file int
	off  int64 // absolute offset in the file
}

// Options tune Create.
type Options struct {
	Resume bool // reuse a matching path+".partial" from an earlier run
	// NoSync leaves the bytes in the page cache as cp does: no fsync of
	// the file or its directory, and no early writeback. A kill or Ctrl-C
	// loses nothing; a power loss or system crash soon after can lose or
	// damage the file (see TensorJournal's NoSync for resumes).
	NoSync bool
}

// PartialPath is where a Writer for path writes until Close.
func PartialPath(path string) string { return path + fsutil.PartialSuffix }

// Create starts writing layout to path (to the parts named after path when
// the layout has a Split: Layout.Files).
func Create(path string, layout *Layout, opt Options) (*Writer, error) {
	w := &Writer{path: path, layout: layout, written: make([]bool, len(layout.Tensors)), noSync: opt.NoSync}
	var base int64
	for k, p := range layout.Files(path) {
		fl := layout.FileLayouts()[k]
		w.files = append(w.files, &wfile{path: p, tmp: PartialPath(p), layout: fl, base: base})
		base += fl.Size
	}
	w.loc = make([]tensorLoc, len(layout.Tensors))
	for i := range w.loc {
		w.loc[i].file, w.loc[i].off = layout.Locate(i)
	}
	if opt.Resume {
		w.takeBackParts()
		if w.reusable() {
			for _, f := range w.files {
				f.startWriteback(w.noSync)
			}
			w.resumed = true
			return w, nil
		}
	}
	for _, f := range w.files {
		if err := w.create(f); err != nil {
			w.Abort()
			return nil, err
		}
	}
	w.removeStalePartials()
	return w, nil
}

// removeStalePartials removes the partial files an earlier, other plan of
// the same output left: path's own, or the parts of a split of path into
// another number of parts (the journal, path's too, has started over).
func (w *Writer) removeStalePartials() {
	ours := map[string]bool{}
	for _, f := range w.files {
		ours[f.tmp] = true
	}
	prefix := SplitPrefix(w.path)
	stale := []string{PartialPath(w.path)}
	ents, _ := os.ReadDir(filepath.Dir(w.path))
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), fsutil.PartialSuffix)
		if !ok {
			continue
		}
		p := filepath.Join(filepath.Dir(w.path), name)
		if pre, _, _, ok := ParseSplitName(p); ok && pre == prefix {
			stale = append(stale, PartialPath(p))
		}
	}
	for _, p := range stale {
		if !ours[p] {
			os.Remove(p)
		}
	}
}

// create makes f's partial file: the header, the file's blocks reserved,
// zeros everywhere else.
func (w *Writer) create(f *wfile) error {
	fh, err := os.OpenFile(f.tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	f.f = fh
	f.startWriteback(w.noSync)
	if _, err := fh.WriteAt(f.layout.Header, 0); err != nil {
		return err
	}
	if err := reserve(fh.Fd(), f.layout.Size); err != nil {
		return fmt.Errorf("%s: reserving %d bytes: %w", f.tmp, f.layout.Size, err)
	}
	// Extending the file zero-fills every padding gap.
	return fh.Truncate(f.layout.Size)
}

// takeBackParts undoes the renames of a split commit that was cut short:
// while the first part is still partial, the later parts already renamed
// into place are not a finished split, and become partial again.
func (w *Writer) takeBackParts() {
	if len(w.files) < 2 {
		return
	}
	if _, err := os.Stat(w.files[0].tmp); err != nil {
		return
	}
	for _, f := range w.files[1:] {
		if _, err := os.Stat(f.tmp); err == nil {
			continue
		}
		if st, err := os.Stat(f.path); err == nil && st.Mode().IsRegular() && st.Size() == f.layout.Size {
			os.Rename(f.path, f.tmp)
		}
	}
}

// reusable opens every partial file if all of them match the plan.
func (w *Writer) reusable() bool {
	for k, f := range w.files {
		fh, ok := reusable(f.tmp, f.layout)
		if !ok {
			for _, g := range w.files[:k] {
				g.f.Close()
				g.f = nil
			}
			return false
		}
		f.f = fh
	}
	return true
}

func reusable(tmp string, layout *Layout) (*os.File, bool) {
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return nil, false
	}
	st, err := f.Stat()
	if err != nil || st.Size() != layout.Size {
		f.Close()
		return nil, false
	}
	got := make([]byte, len(layout.Header))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, layout.Header) {
		f.Close()
		return nil, false
	}
	return f, true
}

// ReadAt reads back bytes of the partial files, at offsets into their
// concatenation in order (for one file, its own offsets).
func (w *Writer) ReadAt(b []byte, off int64) (int, error) {
	n := 0
	for _, f := range w.files {
		if n == len(b) {
			break
		}
		pos := off + int64(n)
		if pos >= f.base+f.layout.Size {
			continue
		}
		m, err := f.f.ReadAt(b[n:min(len(b), n+int(f.base+f.layout.Size-pos))], pos-f.base)
		n += m
		if err != nil {
			return n, err
		}
	}
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// FileBounds are where each file ends in the concatenation ReadAt reads.
func (w *Writer) FileBounds() []int64 {
	ends := make([]int64, len(w.files))
	for k, f := range w.files {
		ends[k] = f.base + f.layout.Size
	}
	return ends
}

// TensorStart is where tensor i starts in the concatenation ReadAt reads.
func (w *Writer) TensorStart(i int) int64 {
	l := w.loc[i]
	return w.files[l.file].base + l.off
}

// Path is the final name of the file (of the first part, for a split).
func (w *Writer) Path() string { return w.files[0].path }

// Paths are the final names of every file written, in order.
func (w *Writer) Paths() []string {
	ps := make([]string, len(w.files))
	for k, f := range w.files {
		ps[k] = f.path
	}
	return ps
}

// Resumed reports whether Create reused an earlier partial file.
func (w *Writer) Resumed() bool { return w.resumed }

// Layout is the plan being written.
func (w *Writer) Layout() *Layout { return w.layout }

// Section reads back tensor i's bytes in the partial file (to verify a
// tensor before Skip on resume).
func (w *Writer) Section(i int) *io.SectionReader {
	l := w.loc[i]
	return io.NewSectionReader(w.files[l.file].f, l.off, w.layout.Tensors[i].Size())
}

// Skip marks tensor i as already present (resume).
func (w *Writer) Skip(i int) {
	w.mu.Lock()
	w.written[i] = true
	w.mu.Unlock()
}

// TensorWriter returns a writer for tensor i's body, positioned at its
// offset. Exactly Size() bytes must be written, then Finish(i) called.
func (w *Writer) TensorWriter(i int) io.Writer {
	l := w.loc[i]
	return io.NewOffsetWriter(w.files[l.file].f, l.off)
}

// WriteAt writes part of tensor i's body: b at byte off within the
// tensor. It is safe for concurrent use on disjoint ranges. The writes
// themselves are serialized: buffered writes to one file take its inode
// lock, and a kernel waiter spins on it (burning the core another worker
// could convert on), while a Go mutex parks it. Writeback of the written
// bytes starts in the background (Linux), so Close's fsync has little
// left to do.
func (w *Writer) WriteAt(i int, b []byte, off int64) error {
	return w.writeAt(context.Background(), i, b, off, nil)
}

// WriteAtHolding is WriteAt for a worker holding a core (cpushare): when
// another worker's write holds the file, it gives its core back while it
// waits, and takes one again after its write. A write can wait long
// (seconds, on a page the kernel is writing back while the disk is
// throttled), and the workers queued behind it would otherwise keep
// every core of their priority idle for as long, work of a lower
// priority waiting for them.
func (w *Writer) WriteAtHolding(ctx context.Context, i int, b []byte, off int64, core *cpushare.Hold) error {
	return w.writeAt(ctx, i, b, off, core)
}

func (w *Writer) writeAt(ctx context.Context, i int, b []byte, off int64, core *cpushare.Hold) error {
	if err := w.sticky(); err != nil {
		return err
	}
	t := w.layout.Tensors[i]
	l := w.loc[i]
	f := w.files[l.file]
	if off < 0 || off+int64(len(b)) > t.Size() {
		return w.fail(fmt.Errorf("%s: tensor %q: %w: bytes %d..%d of %d", f.path, t.Name, ErrWriteSize, off, off+int64(len(b)), t.Size()))
	}
	paused := false
	if !w.wmu.TryLock() {
		if core != nil {
			core.Pause()
			paused = true
		}
		w.wmu.Lock()
	}
	_, err := f.f.WriteAt(b, l.off+off)
	w.wmu.Unlock()
	if err != nil {
		return w.fail(fmt.Errorf("%s: tensor %q: %w", f.path, t.Name, err))
	}
	f.fl.Wrote(int64(len(b)))
	if paused {
		return core.Resume(ctx)
	}
	return nil
}

// WriteTensor copies tensor i's body from r, which must yield exactly the
// tensor's size. Safe for concurrent use with other tensors.
func (w *Writer) WriteTensor(i int, r io.Reader) error {
	if err := w.sticky(); err != nil {
		return err
	}
	t := w.layout.Tensors[i]
	path := w.files[w.loc[i].file].path
	size := t.Size()
	n, err := io.Copy(w.TensorWriter(i), io.LimitReader(r, size))
	if err != nil {
		return w.fail(fmt.Errorf("%s: tensor %q: %w", path, t.Name, err))
	}
	if n != size {
		return w.fail(fmt.Errorf("%s: tensor %q: %w: %d of %d", path, t.Name, ErrWriteSize, n, size))
	}
	var one [1]byte
	if m, _ := r.Read(one[:]); m != 0 {
		return w.fail(fmt.Errorf("%s: tensor %q: %w: more than %d", path, t.Name, ErrWriteSize, size))
	}
	return w.Finish(i)
}

// WriteTensorBytes writes tensor i's whole body from b.
func (w *Writer) WriteTensorBytes(i int, b []byte) error {
	if err := w.sticky(); err != nil {
		return err
	}
	t := w.layout.Tensors[i]
	l := w.loc[i]
	f := w.files[l.file]
	if int64(len(b)) != t.Size() {
		return w.fail(fmt.Errorf("%s: tensor %q: %w: %d of %d", f.path, t.Name, ErrWriteSize, len(b), t.Size()))
	}
	if _, err := f.f.WriteAt(b, l.off); err != nil {
		return w.fail(fmt.Errorf("%s: tensor %q: %w", f.path, t.Name, err))
	}
	return w.Finish(i)
}

// Finish marks tensor i as written (after TensorWriter).
func (w *Writer) Finish(i int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.written[i] = true
	return w.err
}

func (w *Writer) sticky() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return ErrWriterDone
	}
	return w.err
}

func (w *Writer) fail(err error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
	return w.err
}

// startWriteback starts the early writeback of a file that is fsynced at
// the end; one that is not is left to the kernel, as cp leaves its files.
func (f *wfile) startWriteback(noSync bool) {
	if !noSync {
		f.fl = fsutil.NewWriteback(f.f)
	}
}

// sync fsyncs the partial files unless the writer skips fsync.
func (w *Writer) sync() error {
	if w.noSync {
		return nil
	}
	for _, f := range w.files {
		if f.f == nil {
			continue
		}
		w.syncs.Add(1)
		if err := f.f.Sync(); err != nil {
			return fmt.Errorf("%s: fsync: %w", f.tmp, err)
		}
	}
	return nil
}

// Sync fsyncs the partial files (a resume point); with Options.NoSync it
// does nothing.
func (w *Writer) Sync() error { return w.sync() }

// closeFiles stops the writebacks and closes the files.
func (w *Writer) closeFiles() error {
	var err error
	for _, f := range w.files {
		f.fl.Stop()
		if f.f != nil {
			if cerr := f.f.Close(); err == nil {
				err = cerr
			}
			f.f = nil
		}
	}
	return err
}

// Close checks every tensor was written, fsyncs, and renames the files
// into place (a split's parts last to first). On error the partial files
// are kept for a resume unless the error is sticky from a failed write,
// in which case call Abort.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return ErrWriterDone
	}
	if w.err != nil {
		w.mu.Unlock()
		return w.err
	}
	for i, ok := range w.written {
		if !ok {
			w.mu.Unlock()
			return fmt.Errorf("%s: tensor %q was never written", w.files[w.loc[i].file].path, w.layout.Tensors[i].Name)
		}
	}
	w.done = true
	w.mu.Unlock()
	for _, f := range w.files {
		f.fl.Stop()
	}
	if err := w.sync(); err != nil {
		w.closeFiles()
		return err
	}
	if err := w.closeFiles(); err != nil {
		return err
	}
	if len(w.files) > 1 {
		// An earlier split of these names stops looking whole first: its
		// first part must not stand beside new later parts.
		if err := os.Remove(w.files[0].path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	for k := len(w.files) - 1; k >= 0; k-- {
		if err := os.Rename(w.files[k].tmp, w.files[k].path); err != nil {
			return err
		}
	}
	if w.noSync {
		return nil
	}
	w.syncs.Add(1)
	return fsutil.SyncDir(filepath.Dir(w.path))
}

// Abort closes and removes the partial files.
func (w *Writer) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.done = true
	w.closeFiles()
	for _, f := range w.files {
		os.Remove(f.tmp)
	}
}

// Detach closes the partial files and keeps them for a later resume.
func (w *Writer) Detach() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	w.done = true
	for _, f := range w.files {
		f.fl.Stop()
	}
	err := w.sync()
	if cerr := w.closeFiles(); err == nil {
		err = cerr
	}
	return err
}
