package transfer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
)

// DefaultChunkSize is the unit of parallel writes, of the resume journal
// and of repair: a chunk is read once, written by one stream, journaled
// once it is durable on the remote side, and re-sent alone when its
// read-back digest is wrong.
const DefaultChunkSize = 16 << 20

// File is one regular file to send.
type File struct {
	Rel    string        // slash path under the destination directory
	Path   string        // the local file (read through symlinks)
	Size   int64         // bytes
	Perm   fs.FileMode   // permission bits given to the remote file
	Digest digest.Digest // sha256 of the content, known before sending
	Stamp  fsutil.Stamp  // the local file's stamp when it was hashed

	// src, where not nil, is where the bytes are read instead of Path
	// (an object: Path is its URL). digestLater says its Digest is not
	// known before the run reads it ("" until then); claimed, that Digest
	// is what the object's metadata records, checked against the bytes
	// read.
	src         source
	digestLater bool
	claimed     bool
}

// source is a file's bytes elsewhere than on this machine.
type source interface {
	where() string
	// ident names the version planned (the resume journal's ref holds it).
	ident() string
	// readAt reads len(p) bytes at off of the version planned (another
	// version there: ErrSourceChanged); meta is the object's metadata
	// where the read gives it.
	readAt(ctx context.Context, p []byte, off int64) (meta map[string]string, err error)
}

var _ source = (*s3Source)(nil)

// Chunks is the number of chunks of f at chunk size cs (0 for an empty
// file).
func (f *File) Chunks(cs int64) int { return int((f.Size + cs - 1) / cs) }

// Link is a symlink inside a source tree, recreated as a link.
type Link struct {
	Rel    string // slash path under the destination directory
	Target string // relative target, as the link is made remotely
}

// Plan is what a transfer sends: files (with their digests), links and
// directories, all named relative to each destination directory. It reads
// no remote state; every destination gets the same plan.
type Plan struct {
	Files     []File
	Links     []Link
	Dirs      []string // slash paths of directories to create, parents first
	ChunkSize int64

	// later, if not nil, is how Run hashes the files with no digest
	// (PlanOptions.HashLater).
	later *lateHash
}

// lateHash is what a plan made with PlanOptions.HashLater keeps for Run.
type lateHash struct {
	jobs   int
	hashed func(int64)
	cache  *DigestCache
}

// Bytes is the total size of the plan's files.
func (p *Plan) Bytes() int64 {
	var n int64
	for _, f := range p.Files {
		n += f.Size
	}
	return n
}

// PlanOptions tune NewPlan.
type PlanOptions struct {
	// Dereference copies what links point to instead of recreating links,
	// and follows links that leave a source tree instead of refusing them.
	Dereference bool
	// ChunkSize (0: DefaultChunkSize).
	ChunkSize int64
	// Jobs bounds the files hashed at once (< 1: 1).
	Jobs int
	// Hashed is called with each file's byte count as it is hashed.
	Hashed func(n int64)
	// Cache, if not nil, gives the digests of files whose stamp has not
	// changed since they were hashed, and learns the others.
	Cache *DigestCache
	// HashLater leaves the files Cache does not know unhashed: Run hashes
	// before deciding only those a destination holds a file of their size
	// for (to compare) or that go to a destination that needs digests
	// first (an S3 prefix, whose uploads carry them), and every other as
	// it sends it, from the bytes it reads once for all destinations: on
	// a fresh destination each file is read once instead of twice, and
	// nothing waits for a whole tree to be hashed before the first byte
	// is written. Such a plan's resume journal is keyed by the files'
	// stamps (size, mtime, inode), not their digests. A file's bytes are
	// those read between two checks of its stamp; one rewritten in place
	// with its size and mtime kept after planning is sent as it is then
	// (there is no earlier digest to tell). Jobs, Hashed and Cache serve
	// Run's hashing too.
	HashLater bool
}

// ErrSourceChanged is wrapped by errors about a source file that changed
// between planning and sending, or while it was sent.
var ErrSourceChanged = errkind.New(errkind.BadInput, "source changed during the copy")

// NewPlan walks the sources (files and directories; a directory is sent as
// DIR/<its name>/…, as scp -r does) and hashes every file. Symlinks inside
// a tree that resolve inside it are recreated as links; a link to a
// content-addressed blob (a Hugging Face cache, a ferry store) is sent as
// the file it points to; any other link leaving the tree is refused
// (fsutil's symlink policy) unless opts.Dereference.
func NewPlan(ctx context.Context, srcs []string, opts PlanOptions) (*Plan, error) {
	p := &Plan{ChunkSize: opts.ChunkSize}
	if p.ChunkSize <= 0 {
		p.ChunkSize = DefaultChunkSize
	}
	if len(srcs) == 0 {
		return nil, errkind.Errorf(errkind.Usage, "transfer: no source given")
	}
	for _, src := range srcs {
		fi, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		name := filepath.Base(filepath.Clean(src))
		if fi.IsDir() {
			w := walker{p: p, root: src, deref: opts.Dereference}
			if w.rootReal, err = filepath.EvalSymlinks(src); err != nil {
				return nil, err
			}
			p.Dirs = append(p.Dirs, name)
			if err := w.walk(src, name, 0); err != nil {
				return nil, err
			}
			continue
		}
		if !fi.Mode().IsRegular() {
			return nil, errkind.Errorf(errkind.BadInput, "%s: not a regular file or directory", src)
		}
		p.add(src, name, fi)
	}
	if err := p.check(); err != nil {
		return nil, err
	}
	if opts.HashLater {
		p.later = &lateHash{jobs: opts.Jobs, hashed: opts.Hashed, cache: opts.Cache}
		p.lookup(opts.Cache)
		return p, nil
	}
	return p, p.Hash(ctx, opts.Jobs, opts.Hashed, opts.Cache)
}

// lookup gives the files with no digest those cache knows for the stamps
// the walk just took (no second stat: the stamp is checked again when
// the file is read for sending).
func (p *Plan) lookup(cache *DigestCache) {
	for i := range p.Files {
		f := &p.Files[i]
		if f.Digest != "" {
			continue
		}
		if d, ok := cache.Lookup(f.Path, f.Stamp); ok {
			f.Digest = d
		}
	}
}

// learnt records the digest d of file f, computed from the bytes Run
// read to send it (a HashLater plan).
func (p *Plan) learnt(f *File, d digest.Digest) {
	f.Digest = d
	if p.later != nil {
		p.later.cache.Store(f.Path, f.Stamp, d)
	}
}

func (p *Plan) add(local, rel string, fi fs.FileInfo) {
	p.Files = append(p.Files, File{Rel: rel, Path: local, Size: fi.Size(), Perm: fi.Mode().Perm(), Stamp: fsutil.StampOf(fi)})
}

// AddFile adds a file whose digest is already known (a pipeline output:
// the manifest recorded it, so it is not hashed again). The local file's
// size must match.
func (p *Plan) AddFile(local, rel string, d digest.Digest, size int64) error {
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	if fi.Size() != size {
		return errkind.Errorf(errkind.VerifyFailed, "%s: %d bytes, the manifest records %d", local, fi.Size(), size)
	}
	p.add(local, rel, fi)
	p.Files[len(p.Files)-1].Digest = d
	for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
		p.Dirs = append(p.Dirs, dir)
	}
	return nil
}

// check refuses two sources that land on one remote name, and sorts the
// directories parents first.
func (p *Plan) check() error {
	seen := map[string]string{}
	for _, f := range p.Files {
		if prev, dup := seen[f.Rel]; dup {
			return errkind.Errorf(errkind.Usage, "transfer: %s and %s would both be sent as %s", prev, f.Path, f.Rel)
		}
		seen[f.Rel] = f.Path
	}
	for _, l := range p.Links {
		if prev, dup := seen[l.Rel]; dup {
			return errkind.Errorf(errkind.Usage, "transfer: %s and a link would both be sent as %s", prev, l.Rel)
		}
		seen[l.Rel] = l.Rel
	}
	dirs := map[string]bool{}
	for _, d := range p.Dirs {
		dirs[d] = true
	}
	p.Dirs = p.Dirs[:0]
	for d := range dirs {
		p.Dirs = append(p.Dirs, d)
	}
	sort.Slice(p.Dirs, func(i, j int) bool {
		a, b := strings.Count(p.Dirs[i], "/"), strings.Count(p.Dirs[j], "/")
		if a != b {
			return a < b
		}
		return p.Dirs[i] < p.Dirs[j]
	})
	return nil
}

// Hash computes the digest of every file that has none, jobs at a time;
// cache (may be nil) gives those of files unchanged since they were
// hashed.
func (p *Plan) Hash(ctx context.Context, jobs int, hashed func(int64), cache *DigestCache) error {
	idx := make([]int, len(p.Files))
	for i := range idx {
		idx[i] = i
	}
	return p.hash(ctx, idx, jobs, hashed, cache, nil)
}

// hash computes the digest of every file of idx that has none, jobs at a
// time; failed, if not nil, is told of a file that could not be hashed
// (and the others go on), else the first such error ends it.
func (p *Plan) hash(ctx context.Context, idx []int, jobs int, hashed func(int64), cache *DigestCache, failed func(i int, err error)) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(max(jobs, 1))
	for _, i := range idx {
		f := &p.Files[i]
		if f.Digest != "" {
			continue
		}
		before, err := fsutil.StatStamp(f.Path)
		if err != nil {
			if failed != nil {
				failed(i, err)
				continue
			}
			return err
		}
		if d, ok := cache.Lookup(f.Path, before); ok {
			f.Digest, f.Size, f.Stamp = d, before.Size, before
			if hashed != nil {
				hashed(before.Size)
			}
			continue
		}
		g.Go(func() error {
			err := func() error {
				sum, n, err := hashing.File(ctx, f.Path, hashed)
				if err != nil {
					return err
				}
				after, err := fsutil.StatStamp(f.Path)
				if err != nil {
					return err
				}
				if before != after || n != after.Size {
					return fmt.Errorf("%s: %w (while it was hashed)", f.Path, ErrSourceChanged)
				}
				f.Digest, f.Size, f.Stamp = digest.New(sum[:]), n, after
				cache.Store(f.Path, after, f.Digest)
				return nil
			}()
			if err != nil && failed != nil && ctx.Err() == nil {
				failed(i, err)
				return nil
			}
			return err
		})
	}
	return g.Wait()
}

type walker struct {
	p        *Plan
	root     string // the source directory as given
	rootReal string // with links resolved
	deref    bool
}

// maxDepth bounds directory nesting (and a --dereference walk through
// links that loop).
const maxDepth = 64

// walk adds the entries of the local directory dir under rel.
func (w *walker) walk(dir, rel string, depth int) error {
	if depth > maxDepth {
		return errkind.Errorf(errkind.BadInput, "%s: directories nested deeper than %d (a link loop?)", dir, maxDepth)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range ents {
		local := filepath.Join(dir, de.Name())
		r := rel + "/" + de.Name()
		switch {
		case de.Type()&fs.ModeSymlink != 0:
			if err := w.link(local, r, depth); err != nil {
				return err
			}
		case de.IsDir():
			w.p.Dirs = append(w.p.Dirs, r)
			if err := w.walk(local, r, depth+1); err != nil {
				return err
			}
		case de.Type().IsRegular():
			fi, err := de.Info()
			if err != nil {
				return err
			}
			w.p.add(local, r, fi)
		default:
			return errkind.Errorf(errkind.BadInput, "%s: not a regular file, directory or symlink", local)
		}
	}
	return nil
}

// link handles the symlink local (sent as rel).
func (w *walker) link(local, rel string, depth int) error {
	real, err := filepath.EvalSymlinks(local)
	if err != nil {
		return fmt.Errorf("%s: broken symlink: %w", local, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	inside := fsutil.Inside(w.rootReal, real)
	if !inside && !w.deref {
		// Content-addressed blobs are data, not a way out of the tree.
		if err := fsutil.CheckLink(w.root, local); err != nil {
			var le *fsutil.LinkError
			if errors.As(err, &le) {
				return errkind.Mark(errkind.BadInput, fmt.Errorf("%s: %w: links to %s, outside %s (use --dereference to copy what it points to)",
					local, fsutil.ErrLinkOutside, le.Target, w.root))
			}
			return err
		}
	}
	if inside && !w.deref {
		// Recreate it: relative to the link's directory, as it resolves now.
		linkDir, err := filepath.EvalSymlinks(filepath.Dir(local))
		if err != nil {
			return err
		}
		t, err := filepath.Rel(linkDir, real)
		if err != nil {
			return err
		}
		w.p.Links = append(w.p.Links, Link{Rel: rel, Target: filepath.ToSlash(t)})
		return nil
	}
	if fi.IsDir() {
		w.p.Dirs = append(w.p.Dirs, rel)
		return w.walk(real, rel, depth+1)
	}
	if !fi.Mode().IsRegular() {
		return errkind.Errorf(errkind.BadInput, "%s: links to %s, not a regular file", local, real)
	}
	w.p.add(local, rel, fi)
	return nil
}
