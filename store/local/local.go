// Package local is the store's Backend on a directory: an object is the
// file root/KEY. Conditions hold across processes: a create-only write is
// a hard link of a finished temp file (link(2) fails on an existing name),
// a compare-and-swap write or delete runs under an flock(2) striped by key.
// A file is fsynced before its name appears and the directory after.
//
// An ETag is the file's SHA-256 (first 128 bits) for objects of at most
// 1 MiB — records, refs and leases, which compare-and-swap writes — and
// size, mtime and inode for larger ones (blobs, never swapped), so that a
// Head of a blob reads no data.
package local

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/lockfile"
	"github.com/ferry-llm/ferry/store"
)

// Backend is a store directory.
type Backend struct {
	root string
}

var (
	_ store.Backend    = (*Backend)(nil)
	_ store.FilePutter = (*Backend)(nil)
	_ store.FileGetter = (*Backend)(nil)
	_ store.TempKeeper = (*Backend)(nil)
)

// Hidden directories under the root; keys never start with a dot.
const (
	tmpDir      = ".tmp"
	uploadsDir  = ".uploads"
	locksDir    = ".locks"
	lockStripes = 64
	// contentETagMax: objects up to this size have content ETags.
	contentETagMax = 1 << 20
)

// Scaffolding reports whether name, an entry of a store directory's root,
// is one the backend makes before a store's format object: its hidden
// directories, and the probe's scratch. A directory holding nothing else
// is a store whose first open was cut short (a kill, a second copy
// started beside the first).
func Scaffolding(name string) bool {
	switch name {
	case tmpDir, uploadsDir, locksDir, "probe":
		return true
	}
	return false
}

// New opens (making it if needed) the store directory root.
func New(root string) (*Backend, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	return &Backend{root: abs}, nil
}

// sub is the store's own directory d (tmpDir, uploadsDir, locksDir),
// made when first written to: a store that is only read (the source of
// a copy) is left as it was.
func (b *Backend) sub(d string) (string, error) {
	p := filepath.Join(b.root, d)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", fmt.Errorf("store %s: %w", b.root, err)
	}
	return p, nil
}

// Root is the store's directory.
func (b *Backend) Root() string { return b.root }

func (b *Backend) String() string { return b.root }

// path is key's file; a key that could leave the root or name a hidden
// directory is refused.
func (b *Backend) path(key string) (string, error) {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasPrefix(key, ".") || strings.Contains(key, "\\") {
		return "", fmt.Errorf("store %s: bad key %q", b.root, key)
	}
	for _, el := range strings.Split(key, "/") {
		if el == "" || el == "." || el == ".." {
			return "", fmt.Errorf("store %s: bad key %q", b.root, key)
		}
	}
	return filepath.Join(b.root, filepath.FromSlash(key)), nil
}

func notFound(key string) error { return fmt.Errorf("%s: %w", key, store.ErrNotFound) }

func precondition(key string) error { return fmt.Errorf("%s: %w", key, store.ErrPrecondition) }

func contentETag(body []byte) string {
	s := sha256.Sum256(body)
	return `"` + hex.EncodeToString(s[:16]) + `"`
}

func stampETag(fi fs.FileInfo) string {
	st := fsutil.StampOf(fi)
	return fmt.Sprintf(`"%x-%x-%x"`, st.Size, st.MtimeNs, st.Inode)
}

// info reads key's file: its Info, with the ETag its size calls for.
func (b *Backend) info(key, p string) (store.Info, error) {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return store.Info{}, notFound(key)
	}
	if err != nil {
		return store.Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return store.Info{}, err
	}
	if !fi.Mode().IsRegular() {
		return store.Info{}, notFound(key)
	}
	in := store.Info{Key: key, Size: fi.Size(), Modified: fi.ModTime(), Date: time.Now()}
	if fi.Size() <= contentETagMax {
		body, err := io.ReadAll(io.LimitReader(f, contentETagMax+1))
		if err != nil {
			return store.Info{}, fmt.Errorf("%s: %w", p, err)
		}
		in.ETag = contentETag(body)
	} else {
		in.ETag = stampETag(fi)
	}
	return in, nil
}

// Head implements store.Backend.
func (b *Backend) Head(ctx context.Context, key string) (store.Info, error) {
	if err := ctx.Err(); err != nil {
		return store.Info{}, err
	}
	p, err := b.path(key)
	if err != nil {
		return store.Info{}, err
	}
	return b.info(key, p)
}

// Get implements store.Backend.
func (b *Backend) Get(ctx context.Context, key string, max int64) ([]byte, store.Info, error) {
	if err := ctx.Err(); err != nil {
		return nil, store.Info{}, err
	}
	p, err := b.path(key)
	if err != nil {
		return nil, store.Info{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, store.Info{}, notFound(key)
	}
	if err != nil {
		return nil, store.Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, store.Info{}, err
	}
	if !fi.Mode().IsRegular() {
		return nil, store.Info{}, notFound(key)
	}
	if fi.Size() > max {
		return nil, store.Info{}, fmt.Errorf("%s: %w: %d bytes, limit %d", key, store.ErrTooLarge, fi.Size(), max)
	}
	body, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, store.Info{}, fmt.Errorf("%s: %w", p, err)
	}
	if int64(len(body)) > max {
		return nil, store.Info{}, fmt.Errorf("%s: %w: over %d bytes", key, store.ErrTooLarge, max)
	}
	in := store.Info{Key: key, Size: int64(len(body)), Modified: fi.ModTime(), Date: time.Now()}
	if in.Size <= contentETagMax {
		in.ETag = contentETag(body)
	} else {
		in.ETag = stampETag(fi)
	}
	return body, in, nil
}

// GetRange implements store.Backend.
func (b *Backend) GetRange(ctx context.Context, key string, off int64, buf []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := b.path(key)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return notFound(key)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := f.ReadAt(buf, off)
	if n == len(buf) {
		return nil
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%s: %d bytes at %d: %w", key, len(buf), off, err)
}

// writeTemp writes body to a new fsynced temp file and returns its path.
func (b *Backend) writeTemp(body []byte) (string, error) {
	dir, err := b.sub(tmpDir)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, "put-*")
	if err != nil {
		return "", err
	}
	name := f.Name()
	_, err = f.Write(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return "", fmt.Errorf("store %s: %w", b.root, err)
	}
	return name, nil
}

func checkSum(key string, body []byte, want *[32]byte) error {
	if want == nil {
		return nil
	}
	if sha256.Sum256(body) != *want {
		return fmt.Errorf("%s: %w", key, store.ErrBadDigest)
	}
	return nil
}

// Put implements store.Backend.
func (b *Backend) Put(ctx context.Context, key string, body []byte, opt store.PutOptions) (store.Info, error) {
	if err := ctx.Err(); err != nil {
		return store.Info{}, err
	}
	p, err := b.path(key)
	if err != nil {
		return store.Info{}, err
	}
	if err := checkSum(key, body, opt.SHA256); err != nil {
		return store.Info{}, err
	}
	tmp, err := b.writeTemp(body)
	if err != nil {
		return store.Info{}, err
	}
	defer os.Remove(tmp)
	return b.place(key, p, tmp, opt)
}

// place gives the finished temp file tmp the name p under opt's
// conditions.
func (b *Backend) place(key, p, tmp string, opt store.PutOptions) (store.Info, error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return store.Info{}, err
	}
	// Readable by every user of a directory several share (temp files
	// are made 0600); a blob read-only, as a pipeline's store keeps them.
	mode := fs.FileMode(0o644)
	if strings.HasPrefix(key, "blobs/") {
		mode = 0o444
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return store.Info{}, err
	}
	if opt.IfNoneMatch {
		if err := os.Link(tmp, p); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return store.Info{}, precondition(key)
			}
			return store.Info{}, err
		}
	} else {
		unlock, err := b.lock(key)
		if err != nil {
			return store.Info{}, err
		}
		defer unlock()
		if opt.IfMatch != "" {
			cur, err := b.info(key, p)
			if errors.Is(err, store.ErrNotFound) || err == nil && cur.ETag != opt.IfMatch {
				return store.Info{}, precondition(key)
			}
			if err != nil {
				return store.Info{}, err
			}
		}
		if err := os.Rename(tmp, p); err != nil {
			return store.Info{}, err
		}
	}
	if err := fsutil.SyncDir(filepath.Dir(p)); err != nil {
		return store.Info{}, err
	}
	return b.info(key, p)
}

// Delete implements store.Backend.
func (b *Backend) Delete(ctx context.Context, key, ifMatch string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := b.path(key)
	if err != nil {
		return err
	}
	unlock, err := b.lock(key)
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := b.info(key, p)
	if errors.Is(err, store.ErrNotFound) && ifMatch == "" {
		return nil
	}
	if err != nil {
		return err
	}
	if ifMatch != "" && cur.ETag != ifMatch {
		return precondition(key)
	}
	if err := os.Remove(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	dir := filepath.Dir(p)
	if strings.HasPrefix(key, "probe/") && strings.Count(key, "/") == 2 {
		// The probe's scratch directory goes with its last object.
		if os.Remove(dir) == nil {
			dir = filepath.Dir(dir)
		}
	}
	return fsutil.SyncDir(dir)
}

// List implements store.Backend.
func (b *Backend) List(ctx context.Context, prefix string, fn func(store.Info) error) error {
	// Walk the deepest directory the prefix names whole.
	dir := ""
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		dir = prefix[:i]
	}
	start := b.root
	if dir != "" {
		p, err := b.path(dir)
		if err != nil {
			return err
		}
		start = p
	}
	var keys []string
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(b.root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if p != b.root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() && strings.HasPrefix(rel, prefix) {
			keys = append(keys, rel)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store %s: list %s: %w", b.root, prefix, err)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := os.Stat(filepath.Join(b.root, filepath.FromSlash(k)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since the walk
		}
		if err != nil {
			return err
		}
		in := store.Info{Key: k, Size: fi.Size(), Modified: fi.ModTime(), Date: time.Now()}
		if err := fn(in); err != nil {
			return err
		}
	}
	return nil
}

// lock takes key's stripe of the compare-and-swap lock.
func (b *Backend) lock(key string) (func(), error) {
	h := fnv.New32a()
	h.Write([]byte(key))
	dir, err := b.sub(locksDir)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(int(h.Sum32()%lockStripes))), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := flock(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("store %s: lock: %w", b.root, err)
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}

func flock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

// An upload is the directory .uploads/<id>: the file "key", and a file
// "<n>.<sha256 hex>" per durable part.

func (b *Backend) uploadDir(id string) (string, error) {
	if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
		return "", fmt.Errorf("upload %q: %w", id, store.ErrNoUpload)
	}
	d := filepath.Join(b.root, uploadsDir, id)
	if _, err := os.Stat(d); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("upload %s: %w", id, store.ErrNoUpload)
		}
		return "", err
	}
	return d, nil
}

// CreateUpload implements store.Backend.
func (b *Backend) CreateUpload(ctx context.Context, key string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if _, err := b.path(key); err != nil {
		return "", err
	}
	var r [16]byte
	rand.Read(r[:])
	id := hex.EncodeToString(r[:])
	ups, err := b.sub(uploadsDir)
	if err != nil {
		return "", err
	}
	d := filepath.Join(ups, id)
	if err := os.Mkdir(d, 0o755); err != nil {
		return "", err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(d, "key"), []byte(key), 0o644); err != nil {
		return "", err
	}
	return id, nil
}

// UploadPart implements store.Backend.
func (b *Backend) UploadPart(ctx context.Context, key, id string, n int, body []byte, sum [32]byte) (store.Part, error) {
	if err := ctx.Err(); err != nil {
		return store.Part{}, err
	}
	d, err := b.uploadDir(id)
	if err != nil {
		return store.Part{}, err
	}
	if n < 1 || n > store.MaxParts {
		return store.Part{}, fmt.Errorf("upload %s: part number %d out of 1..%d", id, n, store.MaxParts)
	}
	if err := checkSum(fmt.Sprintf("%s part %d", key, n), body, &sum); err != nil {
		return store.Part{}, err
	}
	tmp, err := b.writeTemp(body)
	if err != nil {
		return store.Part{}, err
	}
	defer os.Remove(tmp)
	old, _ := filepath.Glob(filepath.Join(d, strconv.Itoa(n)+".*"))
	name := filepath.Join(d, strconv.Itoa(n)+"."+hex.EncodeToString(sum[:]))
	if err := os.Rename(tmp, name); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return store.Part{}, fmt.Errorf("upload %s: %w", id, store.ErrNoUpload)
		}
		return store.Part{}, err
	}
	for _, o := range old {
		if o != name {
			os.Remove(o)
		}
	}
	if err := fsutil.SyncDir(d); err != nil {
		return store.Part{}, err
	}
	return store.Part{Number: n, Size: int64(len(body)), SHA256: sum, ETag: hex.EncodeToString(sum[:])}, nil
}

// ListParts implements store.Backend.
func (b *Backend) ListParts(ctx context.Context, key, id string) ([]store.Part, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, err := b.uploadDir(id)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(d)
	if err != nil {
		return nil, err
	}
	var parts []store.Part
	for _, e := range ents {
		num, sum, ok := strings.Cut(e.Name(), ".")
		n, err := strconv.Atoi(num)
		raw, herr := hex.DecodeString(sum)
		if !ok || err != nil || herr != nil || len(raw) != 32 {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		p := store.Part{Number: n, Size: fi.Size(), ETag: sum}
		copy(p.SHA256[:], raw)
		parts = append(parts, p)
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].Number < parts[j].Number })
	return parts, nil
}

// CompleteUpload implements store.Backend.
func (b *Backend) CompleteUpload(ctx context.Context, key, id string, parts []store.Part, opt store.PutOptions) (store.Info, error) {
	if err := ctx.Err(); err != nil {
		return store.Info{}, err
	}
	p, err := b.path(key)
	if err != nil {
		return store.Info{}, err
	}
	d, err := b.uploadDir(id)
	if err != nil {
		return store.Info{}, err
	}
	dir, err := b.sub(tmpDir)
	if err != nil {
		return store.Info{}, err
	}
	f, err := os.CreateTemp(dir, "complete-*")
	if err != nil {
		return store.Info{}, err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = func() error {
		defer f.Close()
		for i, part := range parts {
			if i > 0 && part.Number <= parts[i-1].Number {
				return fmt.Errorf("upload %s: parts out of order at %d", id, part.Number)
			}
			src, err := os.Open(filepath.Join(d, strconv.Itoa(part.Number)+"."+hex.EncodeToString(part.SHA256[:])))
			if err != nil {
				return fmt.Errorf("upload %s: part %d (sha256 %x) is not stored: %w", id, part.Number, part.SHA256, err)
			}
			_, err = io.Copy(f, src)
			src.Close()
			if err != nil {
				return err
			}
		}
		return f.Sync()
	}()
	if err != nil {
		return store.Info{}, err
	}
	in, err := b.place(key, p, tmp, store.PutOptions{IfNoneMatch: opt.IfNoneMatch, IfMatch: opt.IfMatch})
	if err != nil {
		return store.Info{}, err
	}
	os.RemoveAll(d)
	return in, nil
}

// AbortUpload implements store.Backend.
func (b *Backend) AbortUpload(ctx context.Context, key, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := b.uploadDir(id)
	if err != nil {
		return err
	}
	return os.RemoveAll(d)
}

// ListUploads implements store.Backend.
func (b *Backend) ListUploads(ctx context.Context, prefix string, fn func(store.Upload) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ents, err := os.ReadDir(filepath.Join(b.root, uploadsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // none made yet
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		k, err := os.ReadFile(filepath.Join(b.root, uploadsDir, e.Name(), "key"))
		if err != nil || !strings.HasPrefix(string(k), prefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if err := fn(store.Upload{Key: string(k), ID: e.Name(), Initiated: fi.ModTime()}); err != nil {
			return err
		}
	}
	return nil
}

// copyFile makes dst a copy of src: a reflink clone where the file system
// has them, else a copy (copy_file_range on Linux), fsynced.
func copyFile(src, dst string) error {
	if err := fsutil.Clone(src, dst); err == nil {
		f, err := os.Open(dst)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// PutFile implements store.FilePutter: the file is cloned or copied into
// a temp file, which is hashed and then linked into place create-only.
func (b *Backend) PutFile(ctx context.Context, key, path string, sum [32]byte) (store.Info, error) {
	p, err := b.path(key)
	if err != nil {
		return store.Info{}, err
	}
	dir, err := b.sub(tmpDir)
	if err != nil {
		return store.Info{}, err
	}
	f, err := os.CreateTemp(dir, "file-*")
	if err != nil {
		return store.Info{}, err
	}
	tmp := f.Name()
	f.Close()
	// A clone makes its destination (it may not exist yet): the random
	// name stays reserved only by its use here.
	os.Remove(tmp)
	defer os.Remove(tmp)
	if err := copyFile(path, tmp); err != nil {
		return store.Info{}, fmt.Errorf("%s: %w", path, err)
	}
	got, _, err := hashing.File(ctx, tmp, nil)
	if err != nil {
		return store.Info{}, err
	}
	if got != sum {
		return store.Info{}, fmt.Errorf("%s from %s: %w", key, path, store.ErrBadDigest)
	}
	return b.place(key, p, tmp, store.PutOptions{IfNoneMatch: true})
}

// LocalFile implements store.LocalFiler.
func (b *Backend) LocalFile(key string) (string, error) {
	p, err := b.path(key)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return "", notFound(key)
	} else if err != nil {
		return "", err
	}
	return p, nil
}

// Temp implements store.TempKeeper on the root's .tmp. A file there and
// the ones named after it (NAME, NAME.partial, NAME.partial.journal,
// NAME.partial.lock: a copy's fetch) go together, judged by the newest
// of them; a group with a lock a live process holds is in use and kept.
func (b *Backend) Temp(ctx context.Context, olderThan time.Duration, remove bool) (store.TempReport, error) {
	var rep store.TempReport
	dir := filepath.Join(b.root, tmpDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, err
	}
	type group struct {
		names  []string
		bytes  int64
		newest time.Time
	}
	groups := map[string]*group{}
	var order []string
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		name := e.Name()
		key, _, _ := strings.Cut(strings.TrimPrefix(name, "."), ".")
		g := groups[key]
		if g == nil {
			g = &group{}
			groups[key] = g
			order = append(order, key)
		}
		g.names = append(g.names, name)
		g.bytes += fi.Size()
		if fi.ModTime().After(g.newest) {
			g.newest = fi.ModTime()
		}
		rep.Files++
		rep.Bytes += fi.Size()
	}
	for _, key := range order {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		g := groups[key]
		// A copy's fetch (copy-HEX) holds locks; a put or a PutFile's
		// temp file holds none, and a process may still be writing or
		// hashing it (a big blob, another machine on a shared mount):
		// those go only once a day old.
		copying := strings.HasPrefix(key, "copy-")
		age := olderThan
		if !copying {
			age = max(olderThan, tempMinAge)
		}
		if !g.newest.Before(time.Now().Add(-age)) {
			continue
		}
		if !remove {
			rep.Removed += len(g.names)
			rep.RemovedBytes += g.bytes
			continue
		}
		// A copy's locks, taken whether or not they were listed (a copy
		// starting now waits for this gc; a dead holder's are taken
		// over): a live process's keeps the group.
		var locks []*lockfile.Lock
		inUse := false
		if copying {
			for _, n := range []string{key + ".lock", key + ".partial.lock"} {
				l, err := lockfile.TryLock(filepath.Join(dir, n), "temp file", "store gc")
				if err != nil {
					inUse = true
					break
				}
				locks = append(locks, l)
			}
		}
		var rerr error
		if !inUse {
			for _, n := range g.names {
				if !strings.HasSuffix(n, ".lock") {
					if rerr = os.RemoveAll(filepath.Join(dir, n)); rerr != nil {
						break
					}
				}
			}
		}
		for _, l := range locks {
			l.Unlock()
		}
		if rerr != nil {
			return rep, rerr
		}
		if !inUse {
			rep.Removed += len(g.names)
			rep.RemovedBytes += g.bytes
		}
	}
	return rep, nil
}

// tempMinAge is the least age of a temp file Temp removes that no lock
// keeps (a put's, a PutFile's).
const tempMinAge = 24 * time.Hour

// TempDir implements store.FileAdopter.
func (b *Backend) TempDir() (string, error) { return b.sub(tmpDir) }

// AdoptFile implements store.FileAdopter: a hard link of path at key.
func (b *Backend) AdoptFile(ctx context.Context, key, path string) (store.Info, error) {
	if err := ctx.Err(); err != nil {
		return store.Info{}, err
	}
	p, err := b.path(key)
	if err != nil {
		return store.Info{}, err
	}
	return b.place(key, p, path, store.PutOptions{IfNoneMatch: true})
}

// GetFile implements store.FileGetter: a clone or a copy of key's file.
func (b *Backend) GetFile(ctx context.Context, key, dst string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return notFound(key)
	}
	os.Remove(dst)
	return copyFile(p, dst)
}
