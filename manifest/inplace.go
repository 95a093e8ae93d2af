package manifest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
)

// Blobs that are not copies.
//
// An import need not copy what it imports. Where the store's file system
// can clone (reflink) a file, the blob is a clone (IngestClone): a file of
// its own that shares the source's blocks, so it costs neither time nor
// space. Elsewhere the blob is read in place (Reference): blobs/sha256/<hex>
// is a symlink to the source file's absolute path, recorded with the stamp
// the file had when it was hashed. Such a blob is the file: CheckBlob says
// it changed as soon as the file's stamp does (the import then re-hashes
// it), Verify re-hashes it, GC removes only the link and never the file,
// and a stage that writes the same bytes into the store (place, AdoptKnown)
// replaces the link with its real file.

// InPlace returns the file that blob d reads in place, if d is an in-place
// blob (a link out of the store).
func (s *Store) InPlace(d Digest) (string, bool) {
	t, err := os.Readlink(s.BlobPath(d))
	return t, err == nil
}

func isLinkPath(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// Reference makes the file src, which hashed to d while its stamp was st,
// blob d without copying it: a link to it. A blob d already there and
// intact (a copy, or a link to a file still as it was hashed) is kept.
func (s *Store) Reference(src string, d Digest, st Stamp) error {
	if err := d.Validate(); err != nil {
		return err
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	// The file itself, not a link to it that may be re-pointed (a Hugging
	// Face snapshot moving to a new revision).
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return err
	}
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	dst := s.BlobPath(d)
	if fi, err := os.Stat(dst); err == nil && fi.Size() == st.Size {
		if rec, ok := s.stamp(d); ok && rec == StampOf(fi) && s.Damage(d) == "" {
			return nil
		}
	}
	if cur, err := StatStamp(abs); err != nil || cur != st {
		return fmt.Errorf("%s: changed since it was hashed", src)
	}
	tmp := filepath.Join(s.Root, "tmp", fmt.Sprintf("ref-%s-%d%s", d.Short(), adoptSeq.Add(1), fsutil.PartialSuffix))
	os.Remove(tmp)
	if err := os.Symlink(abs, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := fsutil.SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	s.setStamp(d, st)
	return nil
}

// DropInPlace removes blob d if it is a link to the file src (an import
// found that file holding other bytes now): the link would read bytes that
// are not d's. The records naming d go too (saved with the next manifest
// write), and the pipeline stages pointing at them: those bytes are gone
// for good, and records are keyed by content, so the import that read the
// file before it changed does not get its record replaced by the new run.
// The file itself is never touched.
func (s *Store) DropInPlace(d Digest, src string) error {
	abs, err := filepath.Abs(src)
	if err != nil {
		return err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	if cur, ok := s.InPlace(d); !ok || cur != abs {
		return nil
	}
	if err := os.Remove(s.BlobPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	s.mu.Lock()
	delete(s.m.Blobs, d.Hex())
	delete(s.m.Damaged, d.Hex())
	s.dropRecordsLocked(d)
	s.mu.Unlock()
	return nil
}

// dropRecordsLocked removes the records that name blob d as an output, and
// the pipeline stages' pointers to them.
func (s *Store) dropRecordsLocked(d Digest) {
	for k, r := range s.m.Records {
		for _, o := range r.Outputs {
			if o.Digest == d {
				delete(s.m.Records, k)
				break
			}
		}
	}
	for _, stages := range s.m.Pipelines {
		for st, k := range stages {
			if s.m.Records[k] == nil {
				delete(stages, st)
			}
		}
	}
}

// refDir is the resume directory of output ref of the stage run with key.
func (s *Store) refDir(key, ref string) (string, error) {
	if err := checkRelPath(ref); err != nil {
		return "", err
	}
	dir := filepath.Join(s.IngestDir(key), DigestOf([]byte(ref)).Short())
	return dir, os.MkdirAll(dir, 0o755)
}

// hashRef is the journal ref of HashResumable: the output and the stamp of
// the file whose content is hashed, so a file that changed starts over.
func hashRef(ref string, st Stamp) string {
	b, _ := json.Marshal(st) // a struct of numbers always marshals
	return "hash " + ref + " " + string(b)
}

// hashUnit names the unit lines of HashResumable's journal.
const hashUnit = "hash"

// HashResumable hashes the file at p, whose content is that of a file with
// stamp st (p itself, or a clone of it), for output ref of the stage run
// with key. After every unit bytes it records the sha256 state
// (hashing.Writer.State) in the ref's journal (internal/journal, in the
// stage's ingest directory, as OpenJournal's), so a killed run continues
// from the last unit boundary instead of byte 0; the journal's ref names ref
// and st, so a file that changed starts over. The lines are not fsynced:
// they only save work (a crash may lose the last few; see
// journal.AppendNoSync). A file of one unit or less keeps no journal. It
// fails if the file ends early or its stamp changes while it is read.
// progress, if not nil, gets the bytes hashed (those of earlier runs
// first).
func (s *Store) HashResumable(ctx context.Context, key, ref, p string, st Stamp, unit int64, progress func(int64)) (Digest, error) {
	if unit <= 0 {
		return "", errors.New("manifest: HashResumable: unit must be positive")
	}
	if progress == nil {
		progress = func(int64) {}
	}
	dir, err := s.refDir(key, ref)
	if err != nil {
		return "", err
	}
	h := hashing.NewWriter(nil)
	var log *journal.Log
	if st.Size > unit {
		jref := hashRef(ref, st)
		var entries []journal.Entry
		if log, entries, _, err = journal.Open(filepath.Join(dir, "journal"), jref); err != nil {
			return "", err
		}
		defer log.Close()
		if len(entries) > 0 {
			last := entries[len(entries)-1]
			r, err := hashing.Resume(nil, last.State, last.End)
			if last.Unit != hashUnit || last.End <= 0 || last.End > st.Size || err != nil {
				// Not a journal this function wrote: start over.
				if err := log.Reset(jref); err != nil {
					return "", err
				}
			} else {
				h = r
			}
		}
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	off := h.Size()
	progress(off)
	// The next chunks are read while one is hashed (a cold file reads at
	// disk speed, which is about sha256's); chunks end at unit boundaries.
	type chunk struct {
		b   []byte
		err error
	}
	const nbuf, bufSize = 3, 4 << 20
	free := make(chan []byte, nbuf)
	for range nbuf {
		free <- make([]byte, bufSize)
	}
	chunks := make(chan chunk, nbuf)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(chunks)
		for pos := off; pos < st.Size; {
			var b []byte
			select {
			case b = <-free:
			case <-stop:
				return
			}
			end := min(st.Size, (pos/unit+1)*unit, pos+bufSize)
			n, err := f.ReadAt(b[:end-pos], pos)
			pos += int64(n)
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%s: changed while it was being read (ends at %d bytes, was %d)", p, pos, st.Size)
			} else if err != nil {
				err = fmt.Errorf("%s: %w", p, err)
			}
			select {
			case chunks <- chunk{b[:n], err}:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		h.Write(c.b)
		off += int64(len(c.b))
		progress(int64(len(c.b)))
		if c.err != nil {
			return "", c.err
		}
		free <- c.b[:cap(c.b)]
		if log == nil || off%unit != 0 || off == st.Size {
			continue // mid-unit, or done: nothing left to resume
		}
		if err := log.AppendNoSync(journal.Entry{Unit: hashUnit, End: off, State: h.State()}); err != nil {
			return "", err
		}
	}
	if off != st.Size {
		return "", fmt.Errorf("%s: read %d bytes, want %d", p, off, st.Size)
	}
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if fi.Size() != st.Size {
		return "", fmt.Errorf("%s: changed while it was being read (%d bytes, was %d)", p, fi.Size(), st.Size)
	}
	sum := h.Sum()
	return NewDigest(sum[:]), nil
}

// IngestClone makes the file src (of stamp st) a blob by cloning it into the
// store (fsutil.Clone) and hashing the clone with HashResumable: no byte is
// copied, and the blob is a file of its own. It returns an error wrapping
// fsutil.ErrCloneUnsupported when the store's file system cannot clone src
// (the caller then references it in place).
func (s *Store) IngestClone(ctx context.Context, key, ref, src string, st Stamp, unit int64, progress func(int64)) (Digest, error) {
	dir, err := s.refDir(key, ref)
	if err != nil {
		return "", err
	}
	// A clone left by a killed run is made again (it costs nothing); the
	// hash journal is bound to the source's stamp, so it still applies.
	c := filepath.Join(dir, "clone")
	if err := os.Remove(c); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err := fsutil.Clone(src, c); err != nil {
		return "", err
	}
	if cur, err := StatStamp(src); err != nil || cur != st {
		os.Remove(c)
		return "", fmt.Errorf("%s: changed while it was being cloned", src)
	}
	d, err := s.HashResumable(ctx, key, ref, c, st, unit, progress)
	if err != nil {
		return "", err
	}
	f, err := os.Open(c)
	if err != nil {
		return "", err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return "", err
	}
	if err := s.place(c, d, st.Size); err != nil {
		return "", err
	}
	return d, nil
}
