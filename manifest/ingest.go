package manifest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
)

// Sentinel errors of the ingest writer.
var (
	ErrSizeMismatch   = errors.New("manifest: size does not match")
	ErrDigestMismatch = errors.New("manifest: digest does not match")
	ErrWriterClosed   = errors.New("manifest: write after commit or abort")
	ErrBadPath        = errors.New("manifest: bad output path")
)

// blobMode is the mode of a committed blob: read-only.
const blobMode = 0o444

// Writer ingests one blob: it writes a temp file inside the store while
// hashing, and Commit checks the length, fsyncs, renames the file to its
// digest and fsyncs the directory. Errors are sticky. Until Commit nothing
// under blobs/ changes; Abort (or a crash) leaves only a temp file in tmp/.
type Writer struct {
	s   *Store
	f   *os.File
	hw  *hashing.Writer // hashes what f accepted (hash only: Ingest hashes on its own goroutine)
	err error
}

// NewWriter starts an ingest.
func (s *Store) NewWriter() (*Writer, error) {
	f, err := os.CreateTemp(filepath.Join(s.Root, "tmp"), "ingest-*"+fsutil.PartialSuffix)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", s.Root, err)
	}
	return &Writer{s: s, f: f, hw: hashing.NewWriter(nil)}, nil
}

// Write appends p to the blob.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n, err := w.f.Write(p)
	w.hw.Write(p[:n])
	if err != nil {
		w.err = err
	}
	return n, err
}

// Size is the number of bytes written so far.
func (w *Writer) Size() int64 { return w.hw.Size() }

// Commit finishes the blob. size < 0 skips the length check; an empty
// expected skips the digest check. A blob that already exists with that
// digest (and is intact by its stamp) is success: the temp file is dropped.
func (w *Writer) Commit(size int64, expected Digest) (Digest, int64, error) {
	if w.err != nil {
		w.Abort()
		return "", 0, w.err
	}
	sum, n := w.hw.Sum(), w.hw.Size()
	d := NewDigest(sum[:])
	if size >= 0 && n != size {
		w.Abort()
		return "", 0, fmt.Errorf("%w: wrote %d bytes, expected %d", ErrSizeMismatch, n, size)
	}
	if expected != "" && expected != d {
		w.Abort()
		return "", 0, fmt.Errorf("%w: got %s, expected %s", ErrDigestMismatch, d, expected)
	}
	tmp := w.f.Name()
	w.err = ErrWriterClosed
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		os.Remove(tmp)
		return "", 0, fmt.Errorf("%s: fsync: %w", tmp, err)
	}
	if err := w.f.Close(); err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	if err := w.s.place(tmp, d, n); err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	return d, n, nil
}

// Abort drops the temp file. Safe after Commit.
func (w *Writer) Abort() {
	if w.f == nil || w.err == ErrWriterClosed {
		return
	}
	w.err = ErrWriterClosed
	w.f.Close()
	os.Remove(w.f.Name())
}

// place moves the fsynced file tmp (of size n and digest d) to its blob path
// and fsyncs the blob directory. If the blob is already there and intact by
// its stamp, tmp is removed instead; a blob that is there but not known
// intact is replaced by tmp, whose content is known good.
func (s *Store) place(tmp string, d Digest, n int64) error {
	s.placeMu.Lock()
	defer s.placeMu.Unlock()
	dst := s.BlobPath(d)
	// Lstat: an in-place blob (a link to a file outside the store) is
	// replaced by the real file, which the store then holds on its own.
	fi, lerr := os.Lstat(dst)
	if lerr == nil && fi.Mode().IsRegular() && fi.Size() == n {
		if st, ok := s.stamp(d); ok && st == StampOf(fi) && s.Damage(d) == "" {
			return os.Remove(tmp)
		}
	}
	if err := os.Chmod(tmp, blobMode); err != nil {
		return err
	}
	if lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
		// An in-place blob, which committed records read, becomes the
		// new file: its stamp is saved first, so that a process killed
		// after the rename leaves them a blob that is intact, not one
		// "changed on disk" (their stages would run again).
		if err := s.saveReplacing(d, tmp); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	if err := fsutil.SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	st, err := StatStamp(dst)
	if err != nil {
		return err
	}
	s.setStamp(d, st)
	return nil
}

// saveReplacing saves manifest.json with the stamp of tmp, the file about
// to become blob d (a rename keeps it), in Manifest.Replacing.
func (s *Store) saveReplacing(d Digest, tmp string) error {
	st, err := StatStamp(tmp)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m.Replacing == nil {
		s.m.Replacing = map[string]Stamp{}
	}
	s.m.Replacing[d.Hex()] = st
	return s.saveLocked()
}

// Ingest copies r into a blob. size < 0 skips the length check. Hashing
// runs on its own goroutine, overlapping the reads and writes (see
// BenchmarkIngest).
func (s *Store) Ingest(r io.Reader, size int64) (Digest, int64, error) {
	w, err := s.NewWriter()
	if err != nil {
		return "", 0, err
	}
	const nbuf, bufSize = 4, 4 << 20
	free := make(chan []byte, nbuf)
	for i := 0; i < nbuf; i++ {
		free <- make([]byte, bufSize)
	}
	toHash := make(chan []byte, nbuf)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for b := range toHash {
			w.hw.Write(b)
			free <- b[:cap(b)]
		}
	}()
	var cerr error
	for cerr == nil {
		buf := <-free
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			_, werr := w.f.Write(buf[:n])
			if werr != nil {
				cerr = werr
				free <- buf
				break
			}
			toHash <- buf[:n]
		} else {
			free <- buf
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			rerr = nil
			close(toHash)
			<-hashed
			return w.Commit(size, "")
		case rerr != nil:
			cerr = rerr
		}
	}
	close(toHash)
	<-hashed
	w.Abort()
	return "", 0, cerr
}

// Adopt makes a finished file that lives on the store's file system (a
// stage's output in its WorkDir) a blob: it hashes the file, then adopts it
// as AdoptKnown does (a hard link; the file stays where it is).
func (s *Store) Adopt(p string) (Digest, int64, error) {
	d, n, err := HashFile(p)
	if err != nil {
		return "", 0, err
	}
	return s.AdoptKnown(p, d, n)
}

// HashFile hashes the file at p.
func HashFile(p string) (Digest, int64, error) {
	return hashFileProgress(context.Background(), p, nil)
}

// checkRelPath accepts a clean, relative, slash-separated path that stays
// inside its directory.
func checkRelPath(p string) error {
	if p == "" || p == "." || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") ||
		path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.ContainsRune(p, 0) {
		return fmt.Errorf("%w: %q", ErrBadPath, p)
	}
	return nil
}

// adoptSeq numbers AdoptKnown's temp names within this process.
var adoptSeq atomic.Uint64

// AdoptKnown makes the finished file at p (on the store's file system, in
// a stage's WorkDir) a blob under the digest its writer computed while
// writing it, without reading it again. The file stays where it is: the blob
// is a hard link to it (made under a temp name, fsynced, renamed), so a
// run killed halfway through adopting a directory still finds every file
// in its work dir. The size is checked; where hard links are not possible
// the file is copied and hashed instead. `ferry store verify` re-hashes.
func (s *Store) AdoptKnown(p string, d Digest, size int64) (Digest, int64, error) {
	if err := d.Validate(); err != nil {
		return "", 0, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", 0, err
	}
	if fi.Size() != size {
		return "", 0, fmt.Errorf("%s: %w: %d bytes, the writer reported %d", p, ErrSizeMismatch, fi.Size(), size)
	}
	if st, ok := s.stamp(d); ok && s.Damage(d) == "" && !isLinkPath(s.BlobPath(d)) {
		if cur, err := StatStamp(s.BlobPath(d)); err == nil && cur == st {
			return d, size, nil // already there and intact
		}
	}
	// A name of its own: another stage may be adopting the same content.
	tmp := filepath.Join(s.Root, "tmp", fmt.Sprintf("adopt-%s-%d%s", d.Short(), adoptSeq.Add(1), fsutil.PartialSuffix))
	os.Remove(tmp) // left by a killed run of an earlier process
	if err := os.Link(p, tmp); err != nil {
		f, err := os.Open(p)
		if err != nil {
			return "", 0, err
		}
		defer f.Close()
		got, n, err := s.Ingest(f, size)
		if err == nil && got != d {
			err = fmt.Errorf("%s: %w: content hashes to %s, the writer reported %s", p, ErrDigestMismatch, got, d)
		}
		return got, n, err
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err == nil {
		err = s.place(tmp, d, size)
	}
	if err != nil {
		os.Remove(tmp)
		return "", 0, err
	}
	return d, size, nil
}
