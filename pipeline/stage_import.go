package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/workers"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/transfer"
)

// importStage ingests a local file or directory into the store, recording
// every file's digest. Its outputs keep the directory's layout, so its view
// is a copy of the directory made of symlinks into the store.
//
//	import: { path: ~/models/Qwen3.5-27B }
//
// An import copies nothing by default. Where the store's file system can
// clone files (reflinks: Btrfs, XFS, APFS) each file becomes a clone in the
// store; elsewhere it is read in place: the blob is a link to the file,
// recorded by digest and stamp, and stages downstream read the file where it
// is. A file whose stamp changes is hashed again (plan says the import
// re-runs); a file that is gone or changed makes the blob missing or
// damaged until the import re-runs. copy: true copies every file into the
// store instead (a store that stands alone, the sources free to go).
// Either way a killed import resumes within a file, from the last 16 MiB
// unit it finished.
//
// Entries whose names start with "." (.git, .cache, …) are not imported.
// Symlinks to files are followed when they stay inside the directory or
// point into a content-addressed store (a Hugging Face cache snapshot is a
// farm of links into ../../blobs/); one that resolves anywhere else is
// refused unless follow_links is set (ferry's symlink policy, as for
// --follow-links). Symlinks to directories are an error.
type importStage struct {
	Path        string `json:"path"`
	FollowLinks bool   `json:"follow_links,omitempty"`
	Copy        bool   `json:"copy,omitempty"`
}

var _ Stage = (*importStage)(nil)
var _ Prober = (*importStage)(nil)

func newImport(p *Params) (Stage, error) {
	raw, err := p.String("path", true)
	if err != nil {
		return nil, err
	}
	if transfer.S3Source(raw) {
		return newS3Import(p, raw)
	}
	if scheme, _, ok := strings.Cut(raw, "://"); ok && scheme != "" && !strings.ContainsAny(scheme, "/.~") {
		return nil, errkind.Mark(errkind.NotBuilt, fmt.Errorf("%v: an import from a %s:// URL is %w (s3://BUCKET/PREFIX and local paths are)",
			p.Errorf("path", "%s", raw), scheme, errkind.ErrNotBuilt))
	}
	path, err := p.Path("path", true)
	if err != nil {
		return nil, err
	}
	follow, err := p.Bool("follow_links", false)
	if err != nil {
		return nil, err
	}
	cp, err := p.Bool("copy", false)
	if err != nil {
		return nil, err
	}
	return &importStage{Path: path, FollowLinks: follow, Copy: cp}, nil
}

func (s *importStage) Params() any { return s }

type sourceFile struct {
	rel   string // slash-separated, relative to the import root
	abs   string
	stamp manifest.Stamp
}

// listSources lists the files to import with their stamps; it reads no data.
func (s *importStage) listSources() ([]sourceFile, error) {
	fi, err := os.Stat(s.Path)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", s.Path, err)
	}
	if !fi.IsDir() {
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("import %s: not a regular file or directory", s.Path)
		}
		return []sourceFile{{rel: filepath.Base(s.Path), abs: s.Path, stamp: manifest.StampOf(fi)}}, nil
	}
	var out []sourceFile
	err = filepath.WalkDir(s.Path, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != s.Path && strings.HasPrefix(de.Name(), ".") {
			if de.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if de.IsDir() {
			return nil
		}
		if !s.FollowLinks {
			if err := fsutil.CheckLink(s.Path, p); err != nil {
				return err
			}
		}
		fi, err := os.Stat(p) // follows symlinks
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return fmt.Errorf("%s: symlink to a directory is not supported in an import", p)
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file", p)
		}
		rel, err := filepath.Rel(s.Path, p)
		if err != nil {
			return err
		}
		out = append(out, sourceFile{rel: filepath.ToSlash(rel), abs: p, stamp: manifest.StampOf(fi)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", s.Path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("import %s: no files to import", s.Path)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, nil
}

// Probe says whether the imported files changed since rec, by stamp.
func (s *importStage) Probe(rec *manifest.Record) (string, error) {
	if transfer.S3Source(s.Path) {
		return s.probeS3(rec)
	}
	files, err := s.listSources()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "source missing: " + s.Path, nil
		}
		return "", err
	}
	if rec == nil {
		return "", nil
	}
	// A record keyed by content may have read the same files elsewhere
	// too (another directory): only the sources under this path count.
	mine := map[string]manifest.Stamp{}
	for p, st := range rec.Sources {
		if s.under(p) {
			mine[p] = st
		}
	}
	if len(mine) == 0 {
		return "source path changed: nothing recorded from " + s.Path, nil
	}
	seen := map[string]bool{}
	for _, f := range files {
		seen[f.abs] = true
		old, ok := mine[f.abs]
		if !ok {
			return "source file added: " + f.rel, nil
		}
		if old != f.stamp {
			return "source file changed: " + f.rel, nil
		}
	}
	var gone []string
	for p := range mine {
		if !seen[p] {
			gone = append(gone, p)
		}
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		return "source file removed: " + gone[0], nil
	}
	// Another import's record (a directory holding this path) is not
	// this one's: its outputs must be these files.
	outs := map[string]bool{}
	for _, o := range rec.Outputs {
		outs[o.Path] = true
	}
	for _, f := range files {
		if !outs[f.rel] {
			return "source file added: " + f.rel, nil
		}
	}
	if len(files) != len(rec.Outputs) {
		return "source path changed: the record read other files than " + s.Path, nil
	}
	return "", nil
}

// under says whether p is this import's path or lies inside it.
func (s *importStage) under(p string) bool {
	if transfer.S3Source(s.Path) {
		// An object's source is URL#ETAG (an ETag holds no "#").
		if i := strings.LastIndexByte(p, '#'); i >= 0 {
			p = p[:i]
		}
		return p == s.Path || strings.HasPrefix(p, s.Path+"/")
	}
	return p == s.Path || strings.HasPrefix(p, s.Path+string(filepath.Separator))
}

// readsFrom says, without touching the file system, whether rec read any
// of its sources where this import reads: if not, Probe(rec) cannot find
// them unchanged.
func (s *importStage) readsFrom(rec *manifest.Record) bool {
	for p := range rec.Sources {
		if s.under(p) {
			return true
		}
	}
	return false
}

func (s *importStage) Run(ctx context.Context, env *Env) (*Result, error) {
	if transfer.S3Source(s.Path) {
		return s.runS3(ctx, env)
	}
	files, err := s.listSources()
	if err != nil {
		return nil, err
	}
	var total int64
	for _, f := range files {
		total += f.stamp.Size
	}
	env.Progress.SetTotal(total)
	prevOut := map[string]manifest.Output{}
	if env.Prev != nil && !env.Verify {
		for _, o := range env.Prev.Outputs {
			prevOut[o.Path] = o
		}
	}
	// Files are read importFiles at a time, each hashed by its own
	// goroutine; the outputs keep the listing's order.
	outs := make([]manifest.Output, len(files))
	err = workers.Each(ctx, len(files), min(importFiles, max(env.Jobs, 1)), func(ctx context.Context, i int) error {
		o, err := s.importOne(ctx, env, files[i], prevOut)
		outs[i] = o
		return err
	})
	if err != nil {
		return nil, err
	}
	res := &Result{Sources: map[string]manifest.Stamp{}, Outputs: outs}
	for _, f := range files {
		res.Sources[f.abs] = f.stamp
	}
	return res, nil
}

// importFiles is how many files an import reads at once. SHA-256 runs at
// 1–2 GB/s on a core, so one file at a time left an NVMe disk (and the
// page cache) mostly idle while a 27B checkpoint's shards were hashed one
// after another; four keep it busy without making a disk that seeks jump
// between many files.
const importFiles = 4

// importOne imports file f: an unchanged file (same stamp as the last
// import, its blob intact) is not read again.
func (s *importStage) importOne(ctx context.Context, env *Env, f sourceFile, prevOut map[string]manifest.Output) (manifest.Output, error) {
	if err := ctx.Err(); err != nil {
		return manifest.Output{}, err
	}
	if o, ok := prevOut[f.rel]; ok && env.Prev.Sources[f.abs] == f.stamp && o.Size == f.stamp.Size &&
		env.Local().CheckBlob(o.Digest, o.Size, false) == "" {
		env.Progress.Add(f.stamp.Size)
		return o, nil
	}
	ingest := referenceFile
	if s.Copy {
		ingest = ingestFile
	}
	o, err := ingest(ctx, env, f)
	if err != nil {
		return manifest.Output{}, err
	}
	// The file read in place under its old digest holds other bytes now:
	// that blob is gone, not a link to the wrong content.
	if env.Prev != nil {
		for _, old := range env.Prev.Outputs {
			if old.Path == f.rel && old.Digest != o.Digest {
				if err := env.Local().DropInPlace(old.Digest, f.abs); err != nil {
					return manifest.Output{}, err
				}
			}
		}
	}
	env.Log.Debug("imported", "file", f.rel, "digest", o.Digest.Short(), "size", o.Size)
	return o, nil
}

// importUnit is the resume unit of an import: after each one the copied
// bytes and the hash state are durable, so a killed import continues from
// the last unit boundary instead of byte 0.
const importUnit = 16 << 20

// importRef names the resume state of f's import: its stamp is part of it,
// so a source that changed since a killed run starts over instead of
// mixing two versions.
func importRef(f sourceFile) string {
	return fmt.Sprintf("%s@%d-%d-%d", f.rel, f.stamp.Size, f.stamp.MtimeNs, f.stamp.Inode)
}

// referenceFile makes f a blob without copying it: a clone where the
// store's file system can make one, else a link to f read in place. Either
// way the bytes are hashed once, resumably.
func referenceFile(ctx context.Context, env *Env, f sourceFile) (manifest.Output, error) {
	ref := importRef(f)
	prog := func(n int64) { env.Progress.Add(n) }
	d, err := env.Local().IngestClone(ctx, env.Key, ref, f.abs, f.stamp, importUnit, prog)
	how := "cloned"
	if errors.Is(err, fsutil.ErrCloneUnsupported) {
		how = "in place"
		d, err = env.Local().HashResumable(ctx, env.Key, ref, f.abs, f.stamp, importUnit, prog)
		if err == nil {
			err = env.Local().Reference(f.abs, d, f.stamp)
		}
	}
	if err != nil {
		return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
	}
	env.Log.Debug("referenced", "file", f.rel, "how", how)
	return manifest.Output{Path: f.rel, Digest: d, Size: f.stamp.Size}, nil
}

// ingestFile copies f into a blob (copy: true). A file of more than one
// unit goes through a resume journal (manifest.Journal: data fsynced and the
// sha256 state saved at every unit boundary) named by importRef. A smaller
// file has nothing to resume within it.
func ingestFile(ctx context.Context, env *Env, f sourceFile) (manifest.Output, error) {
	if f.stamp.Size <= importUnit {
		return ingestSmall(ctx, env, f)
	}
	j, err := env.Local().OpenJournal(env.Key, importRef(f))
	if err != nil {
		return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
	}
	defer j.Close()
	if o, ok := j.Committed(); ok {
		env.Progress.Add(o.Size)
		return manifest.Output{Path: f.rel, Digest: o.Digest, Size: o.Size}, nil
	}
	in, err := os.Open(f.abs)
	if err != nil {
		return manifest.Output{}, err
	}
	defer in.Close()
	off := j.Offset()
	if off > f.stamp.Size {
		return manifest.Output{}, fmt.Errorf("import %s: resume journal is past the end of the file", f.abs)
	}
	if off > 0 {
		env.Log.Debug("import resumes", "file", f.rel, "offset", off)
		env.Progress.Add(off)
		if _, err := in.Seek(off, io.SeekStart); err != nil {
			return manifest.Output{}, err
		}
	}
	r := &ctxReader{ctx: ctx, r: in, p: env.Progress}
	for off < f.stamp.Size {
		end := min(f.stamp.Size, (off/importUnit+1)*importUnit)
		n, err := io.CopyN(j, r, end-off)
		off += n
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("file changed while it was being read (ends at %d bytes, was %d)", off, f.stamp.Size)
			}
			return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
		}
		if err := j.EndUnit(fmt.Sprint((end - 1) / importUnit)); err != nil {
			return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
		}
	}
	// A file rewritten while we read it would record a digest of neither
	// version: refuse.
	if st, err := manifest.StatStamp(f.abs); err != nil || st != f.stamp {
		return manifest.Output{}, fmt.Errorf("import %s: file changed while it was being read", f.abs)
	}
	o, err := j.Commit(f.stamp.Size)
	if err != nil {
		return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
	}
	return manifest.Output{Path: f.rel, Digest: o.Digest, Size: o.Size}, nil
}

func ingestSmall(ctx context.Context, env *Env, f sourceFile) (manifest.Output, error) {
	in, err := os.Open(f.abs)
	if err != nil {
		return manifest.Output{}, err
	}
	defer in.Close()
	d, n, err := env.Local().Ingest(&ctxReader{ctx: ctx, r: in, p: env.Progress}, f.stamp.Size)
	if err != nil {
		return manifest.Output{}, fmt.Errorf("import %s: %w", f.abs, err)
	}
	if st, err := manifest.StatStamp(f.abs); err != nil || st != f.stamp {
		return manifest.Output{}, fmt.Errorf("import %s: file changed while it was being read", f.abs)
	}
	return manifest.Output{Path: f.rel, Digest: d, Size: n}, nil
}

// ctxReader stops a copy when ctx ends and reports progress.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
	p   Progress
}

func (c *ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(b)
	c.p.Add(int64(n))
	return n, err
}
