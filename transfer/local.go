package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/progress"
)

// localDest is a directory on this machine: a disk, an external drive, an
// NFS or SMB mount. Writes are positional into REL.partial; what was
// written is verified by reading it again (each chunk of a larger file as
// it lands, small files in batches), and on a network file system the
// re-read skips this machine's page cache (fsync, then posix_fadvise
// DONTNEED), so it reads what the server holds. A verified partial is
// renamed into place. Durability is one syncfs at the end of the run, and
// an fsync of each directory that got a rename, before the record of what
// was verified is saved: a chunk journaled before a crash is hashed again
// when the run resumes (as every journaled chunk is), so per-chunk fsyncs
// would buy nothing but time (cp + sync is the yardstick).
type localDest struct {
	d   Destination
	o   *Options
	dir string // absolute

	net     bool // on a network file system: re-reads bypass the page cache
	netOnce sync.Once

	dmu   sync.Mutex
	dirty map[string]bool // directories holding renames not yet fsynced
}

// localSmallWriters bounds the writers of small files to a local
// directory.
var localSmallWriters = 8

// localWriteback starts the disk writes of each chunk as soon as it is
// written (startWriteback), so that the disk works while the rest of the
// file is read, hashed and written, not only in the syncfs at the end.
var localWriteback = true

// localVerifier is what reports call the local destination's check.
const localVerifier = "re-read"

func newLocalDest(d Destination, o *Options) *localDest {
	dir := d.Dir
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return &localDest{d: d, o: o, dir: dir, dirty: map[string]bool{}}
}

func (l *localDest) where() string            { return l.dir }
func (l *localDest) remote(rel string) string { return filepath.Join(l.dir, filepath.FromSlash(rel)) }
func (l *localDest) counts() (int64, int64)   { return 0, 0 }
func (l *localDest) slotOf(k int) int         { return k }
func (l *localDest) metaSlot(k int) int       { return k }
func (l *localDest) closeAll()                {}
func (l *localDest) closePartial(string)      {}

func (l *localDest) watch(ctx context.Context, stop <-chan struct{}) {
	select {
	case <-stop:
	case <-ctx.Done():
	}
}

func (l *localDest) probeTools(context.Context) (*remoteTools, error) {
	return &remoteTools{hashCmd: localVerifier, label: localVerifier, ranges: true, syncfs: true, stat: "fstat"}, nil
}

// onNetwork says whether the destination is on a network file system
// (learnt once, when its directory exists).
func (l *localDest) onNetwork() bool {
	l.netOnce.Do(func() { l.net = networkFS(l.dir) })
	return l.net
}

// list walks the roots under the directory.
func (l *localDest) list(ctx context.Context, roots, dirs []string, probe bool) (map[string]entry, bool, error) {
	fi, err := os.Stat(l.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return map[string]entry{}, true, nil
	case err != nil:
		return nil, false, err
	case !fi.IsDir():
		return nil, false, fmt.Errorf("%s %w", l.dir, errNotDir)
	}
	m := map[string]entry{}
	for _, r := range roots {
		root := l.remote(r)
		err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				if p == root && errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, err := filepath.Rel(l.dir, p)
			if err != nil {
				return err
			}
			fi, err := de.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			m[filepath.ToSlash(rel)], err = localEntry(p, fi)
			return err
		})
		if err != nil {
			return nil, false, fmt.Errorf("listing %s: %w", root, err)
		}
	}
	return m, false, nil
}

// localEntry describes what lies at p.
func localEntry(p string, fi fs.FileInfo) (entry, error) {
	e := entry{kind: '?', size: fi.Size(), alloc: -1, mtime: fi.ModTime().Unix()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.alloc = int64(st.Blocks) * 512
	}
	switch {
	case fi.Mode().IsRegular():
		e.kind = 'f'
	case fi.IsDir():
		e.kind = 'd'
	case fi.Mode()&fs.ModeSymlink != 0:
		e.kind = 'l'
		t, err := os.Readlink(p)
		if err != nil {
			return e, err
		}
		e.target = t
	}
	return e, nil
}

func (l *localDest) mkdirs(ctx context.Context, dirs []string, m map[string]entry, top bool) error {
	if top {
		if err := os.MkdirAll(l.dir, 0o755); err != nil {
			return err
		}
	}
	sorted := append([]string(nil), dirs...)
	sort.Slice(sorted, func(i, j int) bool { return strings.Count(sorted[i], "/") < strings.Count(sorted[j], "/") })
	for _, d := range sorted {
		if e, ok := m[d]; ok {
			if e.kind != 'd' {
				return fmt.Errorf("%s %w", l.remote(d), errNotDir)
			}
			continue
		}
		if err := os.Mkdir(l.remote(d), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

func (l *localDest) space(context.Context) (int64, bool, error) {
	free, ok, err := fsutil.FreeSpace(l.dir)
	if err != nil {
		return 0, false, nil // the writes will say
	}
	return free, ok, nil
}

// explain names a full disk for what it is.
func (l *localDest) explain(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		free, _, _ := fsutil.FreeSpace(l.dir)
		return fmt.Errorf("%w (%d bytes free): %v", ErrRemoteFull, free, err)
	}
	return err
}

// localWriteHook, set by tests only, may change what a write puts on disk
// (a destination that corrupts what it is given).
var localWriteHook func(rel string, off int64, data []byte) []byte

func (l *localDest) writeAt(f *os.File, rel string, data []byte, off int64) error {
	if localWriteHook != nil {
		data = localWriteHook(rel, off, data)
	}
	_, err := f.WriteAt(data, off)
	return err
}

func (l *localDest) putSmall(ctx context.Context, slot int, rel string, data []byte, sync bool, prog progress.Reporter) error {
	part := l.remote(rel) + ".partial"
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return l.explain(fmt.Errorf("creating %s: %w", part, err))
	}
	if len(data) > 0 {
		err = l.writeAt(f, rel, data, 0)
	}

	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l.explain(fmt.Errorf("writing %s: %w", part, err))
	}
	if prog != nil {
		prog.Add(int64(len(data)))
	}
	return nil
}

var _ smallChecker = (*localDest)(nil)

// putSmallChecked writes a small file into its partial with mode perm and
// reads it back through the same descriptor (past the page cache on a
// network file system, as hash does), comparing it with data: no second
// open, no hash and no batch between the write and the rename.
func (l *localDest) putSmallChecked(ctx context.Context, slot int, rel string, perm fs.FileMode, data []byte, prog progress.Reporter) (bool, int64, error) {
	part := l.remote(rel) + ".partial"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm.Perm())
	if err != nil {
		return false, 0, l.explain(fmt.Errorf("creating %s: %w", part, err))
	}
	if len(data) > 0 {
		err = l.writeAt(f, rel, data, 0)
	}
	if err != nil {
		f.Close()
		return false, 0, l.explain(fmt.Errorf("writing %s: %w", part, err))
	}
	same, mtime, err := l.readsBack(f, perm, data)
	if cerr := f.Close(); err == nil && cerr != nil {
		return false, 0, l.explain(fmt.Errorf("writing %s: %w", part, cerr))
	}
	if err != nil {
		return false, 0, fmt.Errorf("reading back %s: %w", part, err)
	}
	if prog != nil {
		prog.Add(int64(len(data)))
	}
	return same, mtime, nil
}

// readBackBufs are the buffers small files are read back through.
var readBackBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// readsBack says whether f, just written, holds data and nothing more,
// gives it mode perm (the umask may have taken bits) and returns its
// mtime.
func (l *localDest) readsBack(f *os.File, perm fs.FileMode, data []byte) (bool, int64, error) {
	if l.onNetwork() {
		// Written back first: only clean pages can be dropped.
		if err := f.Sync(); err != nil {
			return false, 0, err
		}
		dropCache(f, 0, int64(len(data)))
	}
	fi, err := f.Stat()
	if err != nil {
		return false, 0, err
	}
	if fi.Mode().Perm() != perm.Perm() {
		if err := f.Chmod(perm.Perm()); err != nil {
			return false, 0, err
		}
	}
	mtime := fi.ModTime().Unix()
	if fi.Size() != int64(len(data)) {
		return false, mtime, nil
	}
	bp := readBackBufs.Get().(*[]byte)
	defer readBackBufs.Put(bp)
	buf := *bp
	for off := 0; off < len(data); {
		b := buf[:min(len(buf), len(data)-off)]
		n, err := f.ReadAt(b, int64(off))
		if n < len(b) {
			if err == nil || err == io.EOF {
				return false, mtime, nil // shorter than written
			}
			return false, 0, err
		}
		if !bytes.Equal(b, data[off:off+n]) {
			return false, mtime, nil
		}
		off += n
	}
	return true, mtime, nil
}

func (l *localDest) createPartial(ctx context.Context, slot int, rel string, size int64) error {
	part := l.remote(rel) + ".partial"
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return l.explain(fmt.Errorf("creating %s: %w", part, err))
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l.explain(fmt.Errorf("creating %s: %w", part, err))
	}
	return nil
}

func (l *localDest) writeChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest, prog progress.Reporter) error {
	if err := l.rewriteChunk(ctx, slot, rel, off, data, sum); err != nil {
		return err
	}
	if prog != nil {
		prog.Add(int64(len(data)))
	}
	return nil
}

// rewriteChunk writes data at off into rel's partial (durable at flush).
func (l *localDest) rewriteChunk(ctx context.Context, slot int, rel string, off int64, data []byte, sum func() digest.Digest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	part := l.remote(rel) + ".partial"
	f, err := os.OpenFile(part, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening %s: %w", part, err)
	}
	err = l.writeAt(f, rel, data, off)
	if err == nil && localWriteback {
		// Start writing the chunk to the disk now, beside the rest of
		// the run, not all at the end's syncfs.
		startWriteback(f, off, int64(len(data)))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l.explain(fmt.Errorf("writing %s at offset %d: %w", part, off, err))
	}
	return nil
}

// hashFiles hashes the files by reading them again, several at once.
func (l *localDest) hashFiles(ctx context.Context, conn int, t *remoteTools, rels []string, n int64) ([]digest.Digest, []int64, error) {
	paths := make([]string, len(rels))
	for i, r := range rels {
		paths[i] = l.remote(r)
	}
	ds := make([]digest.Digest, len(rels))
	ts := make([]int64, len(rels))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, p := range paths {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			d, _, mt, err := l.hash(p, 0, -1, 0)
			ds[i], ts[i] = d, mt
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return ds, ts, nil
}

// hash reads n bytes of p from off (n < 0: to its end) and returns their
// sha256, the sha256 of each cs-byte chunk when cs > 0, and p's mtime.
func (l *localDest) hash(p string, off, n, cs int64) (digest.Digest, []digest.Digest, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", nil, 0, fmt.Errorf("reading back %s: %w", p, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", nil, 0, err
	}
	if n < 0 {
		n = fi.Size() - off
	}
	if l.onNetwork() {
		// Written back first: only clean pages can be dropped.
		if err := f.Sync(); err != nil {
			return "", nil, 0, fmt.Errorf("syncing %s: %w", p, err)
		}
		dropCache(f, off, n)
	}
	whole := sha256.New()
	var chunks []digest.Digest
	bufSize := int64(1 << 20)
	if cs > 0 {
		bufSize = cs
	}
	buf := make([]byte, min(bufSize, max(n, 1)))
	for done := int64(0); done < n; {
		b := buf[:min(int64(len(buf)), n-done)]
		k, err := f.ReadAt(b, off+done)
		if k < len(b) {
			if err == nil || err == io.EOF {
				return "", nil, 0, fmt.Errorf("reading back %s: %d bytes, want %d", p, off+done+int64(k), off+n)
			}
			return "", nil, 0, fmt.Errorf("reading back %s at offset %d: %w", p, off+done, err)
		}
		whole.Write(b)
		if cs > 0 {
			sum := sha256.Sum256(b)
			chunks = append(chunks, digest.New(sum[:]))
		}
		done += int64(k)
	}
	return digest.New(whole.Sum(nil)), chunks, fi.ModTime().Unix(), nil
}

func (l *localDest) rangeHash(ctx context.Context, conn int, t *remoteTools, rel string, cs int64, i int, retry bool) (digest.Digest, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	p := l.remote(rel)
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("reading back %s: %w", p, err)
	}
	off := int64(i) * cs
	d, _, _, err := l.hash(p, off, min(cs, fi.Size()-off), 0)
	return d, err
}

func (l *localDest) readBack(ctx context.Context, slot int, p string, size, cs int64) (digest.Digest, []digest.Digest, error) {
	if err := ctx.Err(); err != nil {
		return "", nil, err
	}
	d, chunks, _, err := l.hash(l.remote(p), 0, size, cs)
	return d, chunks, err
}

func (l *localDest) readBackChunk(ctx context.Context, slot int, rel string, size, cs int64, i int) (digest.Digest, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	off := int64(i) * cs
	d, _, _, err := l.hash(l.remote(rel)+".partial", off, min(cs, size-off), 0)
	return d, err
}

func (l *localDest) commit(ctx context.Context, slot int, rel string, perm fs.FileMode, modeSet, stat bool) (int64, error) {
	final := l.remote(rel)
	part := final + ".partial"
	var mtime int64
	if !modeSet || stat {
		fi, err := os.Stat(part)
		if err != nil {
			return 0, fmt.Errorf("stat %s: %w", part, err)
		}
		if !modeSet && fi.Mode().Perm() != perm.Perm() {
			if err := os.Chmod(part, perm.Perm()); err != nil {
				return 0, fmt.Errorf("chmod %s: %w", part, err)
			}
		}
		mtime = fi.ModTime().Unix()
	}
	if err := os.Rename(part, final); err != nil {
		return 0, fmt.Errorf("renaming %s to %s: %w", part, final, err)
	}
	l.dmu.Lock()
	l.dirty[filepath.Dir(final)] = true
	l.dmu.Unlock()
	return mtime, nil
}

// flush makes what the run wrote durable: one syncfs of the destination's
// file system, then an fsync of each directory that got a rename.
func (l *localDest) flush(ctx context.Context) error {
	if _, err := os.Stat(l.dir); err != nil {
		return nil // nothing was written
	}
	if err := syncFS(l.dir); err != nil {
		return fmt.Errorf("syncing %s: %w", l.dir, err)
	}
	l.dmu.Lock()
	dirs := make([]string, 0, len(l.dirty))
	for d := range l.dirty {
		dirs = append(dirs, d)
	}
	clear(l.dirty)
	l.dmu.Unlock()
	sort.Strings(dirs)
	for _, d := range dirs {
		if err := fsutil.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

func (l *localDest) symlink(ctx context.Context, slot int, rel, target string, e entry) error {
	p := l.remote(rel)
	switch e.kind {
	case 0:
	case 'd':
		return fmt.Errorf("%s is a directory, the source has a link there: %w", p, errNotDir)
	default:
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := os.Symlink(target, p); err != nil {
		return fmt.Errorf("making link %s -> %s: %w", p, target, err)
	}
	l.dmu.Lock()
	l.dirty[filepath.Dir(p)] = true
	l.dmu.Unlock()
	return nil
}

func (l *localDest) remove(ctx context.Context, slot int, rel string, dir bool) error {
	p := l.remote(rel)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return nil
}
