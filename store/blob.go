package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
	"github.com/ferry-llm/ferry/internal/lockfile"
)

// ErrDigestMismatch reports bytes whose SHA-256 is not the digest they were
// named by: a blob the storage returned damaged, or a source that changed
// while it was uploaded. Nothing is kept of them.
var ErrDigestMismatch = errkind.New(errkind.VerifyFailed, "store: content does not match its digest")

// DamagedError is a FetchBlob of bytes that do not hash to the blob's
// name as the storage returned them (errors.Is ErrDigestMismatch): what
// RemoveDamaged takes.
type DamagedError struct {
	Blob digest.Digest
	Got  digest.Digest // what the bytes read hash to
	Size int64         // how many there were
	ETag string        // the version read
	msg  string
}

func (e *DamagedError) Error() string { return e.msg }
func (e *DamagedError) Unwrap() error { return ErrDigestMismatch }

// damaged is the DamagedError of a fetch of blob d, version etag, whose
// n bytes hashed to got.
func (s *Store) damaged(d, got digest.Digest, n int64, etag string) error {
	return &DamagedError{Blob: d, Got: got, Size: n, ETag: etag,
		msg: fmt.Sprintf("%s: blob %s: the storage returned %d bytes that hash to %s; nothing kept: %v", s.b, d, n, got.Short(), ErrDigestMismatch)}
}

// RemoveDamaged removes the blob a FetchBlob found damaged once it is
// hashed again, as the storage returns it, with the same answer, by a
// delete conditional on the version read (what verify --repair does for
// one blob): the records that name it then name a missing blob, which
// the next run that makes their stage stores again. An error says why it
// was left (the second read whole: the first was damaged on its way).
func (s *Store) RemoveDamaged(ctx context.Context, e *DamagedError) error {
	return s.removeDamaged(ctx, e.Blob, e.Got, e.ETag)
}

// ErrBlobMissing reports a blob that is not in the store (a record whose
// blob is gone).
var ErrBlobMissing = errkind.New(errkind.VerifyFailed, "store: blob missing")

// HasBlob reports whether the blob is stored, and its size.
func (s *Store) HasBlob(ctx context.Context, d digest.Digest) (int64, bool, error) {
	in, err := s.b.Head(ctx, BlobKey(d))
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return in.Size, true, nil
}

// firstPartPrio is added to the priority of an upload's part when none of
// its parts is in flight (Options.UploadInFlight): above any blob's size.
const firstPartPrio = math.MaxInt64 / 2

// partCorePrio is the priority of a part's hold on Options.Cores: above
// all the work beside the uploads.
const partCorePrio = math.MaxInt64

// partCore takes a core of Options.Cores for a part about to be hashed
// and sent; done gives it back once the part is hashed (sent is false)
// or, with its server on this machine, once the server has it (sent).
// Without Options.Cores it takes nothing.
func (s *Store) partCore(ctx context.Context) (done func(sent bool), err error) {
	if s.opt.Cores == nil {
		return func(bool) {}, nil
	}
	if err := s.opt.Cores.Acquire(ctx, partCorePrio); err != nil {
		return nil, err
	}
	held := true
	whole := s.local
	return func(sent bool) {
		if held && (sent || !whole) {
			held = false
			s.opt.Cores.Release()
		}
	}, nil
}

// partSize is the part size for a blob of size bytes: the store's, or
// larger where the blob would need more than MaxParts parts.
func (s *Store) partSize(size int64) int64 {
	ps := s.opt.PartSize
	if min := (size + MaxParts - 1) / MaxParts; ps < min {
		ps = (min + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return ps
}

// PutBlob stores the size bytes of src as the blob d. An existing blob of
// that size is success (content addressing: it holds the same bytes). A
// blob up to the part size is one create-only write carrying its SHA-256;
// a larger one a multipart upload with each part's SHA-256, resumable: the
// upload id and the hash state at each durable part are journaled under
// the cache directory, and a later PutBlob of the same blob continues
// from the parts the storage lists. The upload completes only if src's
// bytes hash to d (ErrDigestMismatch otherwise, and the upload is
// dropped), create-only. progress, if not nil, is told of bytes stored,
// from one goroutine at a time.
func (s *Store) PutBlob(ctx context.Context, d digest.Digest, src io.ReaderAt, size int64, progress func(int64)) error {
	if err := d.Validate(); err != nil {
		return err
	}
	if progress == nil {
		progress = func(int64) {}
	}
	if size <= s.opt.PartSize {
		return s.putSmall(ctx, d, src, size, progress)
	}
	return s.putMultipart(ctx, d, src, size, nil, progress)
}

func sumOf(d digest.Digest) [32]byte {
	var sum [32]byte
	hex.Decode(sum[:], []byte(d.Hex())) // d is validated: 64 hex digits
	return sum
}

// existing reports whether the blob d is stored with size bytes; one of
// another size is damage.
func (s *Store) existing(ctx context.Context, d digest.Digest, size int64) (bool, error) {
	got, ok, err := s.HasBlob(ctx, d)
	if err != nil || !ok {
		return false, err
	}
	if got != size {
		return false, fmt.Errorf("%s: blob %s holds %d bytes, its content has %d: %w", s.b, d.Short(), got, size, ErrDigestMismatch)
	}
	return true, nil
}

func (s *Store) putSmall(ctx context.Context, d digest.Digest, src io.ReaderAt, size int64, progress func(int64)) error {
	buf := make([]byte, size)
	if _, err := src.ReadAt(buf, 0); err != nil && !(errors.Is(err, io.EOF) && size == 0) {
		return fmt.Errorf("blob %s: read: %w", d.Short(), err)
	}
	sum := sumOf(d)
	core, err := s.partCore(ctx)
	if err != nil {
		return err
	}
	defer core(true)
	if sha256.Sum256(buf) != sum {
		return fmt.Errorf("blob %s: source bytes hash to %s: %w", d.Short(), digest.Of(buf).Short(), ErrDigestMismatch)
	}
	core(false)
	_, err = s.b.Put(ctx, BlobKey(d), buf, PutOptions{IfNoneMatch: true, SHA256: &sum})
	core(true)
	if errors.Is(err, ErrPrecondition) {
		ok, herr := s.existing(ctx, d, size)
		if herr != nil {
			return herr
		}
		if !ok {
			return fmt.Errorf("blob %s: create refused, yet the blob is not there: %w", d.Short(), err)
		}
		err = nil
	}
	if err == nil {
		progress(size)
	}
	return err
}

// uploadJournal is the journal of an upload of blob d into this store: a
// directory per store, so that uploads of one blob into two stores (a
// copy to two buckets, one killed) keep their own.
func (s *Store) uploadJournal(d digest.Digest) string {
	id := sha256.Sum256([]byte(s.b.String()))
	return filepath.Join(s.opt.CacheDir, "uploads", hex.EncodeToString(id[:8]), d.Hex())
}

// A multipart upload's journal: the ref names the blob, its size, the part
// size and the store; then a unit "upload" whose Commit is the upload id,
// then per part, once it and every part before it are durable on the
// storage, a unit "part N" with End (the offset after it) and State (the
// sha256 state there).

// With unchanged set (PutKnownFile), src is not hashed whole: the parts'
// own SHA-256s are compared with those the storage lists, a resume re-reads
// every part, and unchanged must pass before the upload completes.
func (s *Store) putMultipart(ctx context.Context, d digest.Digest, src io.ReaderAt, size int64, unchanged func() error, progress func(int64)) (err error) {
	known := unchanged != nil
	key := BlobKey(d)
	ps := s.partSize(size)
	nparts := int((size + ps - 1) / ps)
	if ok, err := s.existing(ctx, d, size); ok || err != nil {
		if ok {
			progress(size)
		}
		return err
	}
	jp := s.uploadJournal(d)
	if err := os.MkdirAll(filepath.Dir(jp), 0o755); err != nil {
		return err
	}
	// One upload of a blob at a time on this machine (two stages making
	// the same bytes): the other waits, then finds the blob there.
	unlock, err := machineLock(ctx, jp+".lock", "upload of blob "+d.Short(), "store put")
	if err != nil {
		return err
	}
	defer unlock()
	if ok, err := s.existing(ctx, d, size); ok || err != nil {
		if ok {
			progress(size)
		}
		return err
	}
	ref := fmt.Sprintf("put %s size %d part %d to %s", d, size, ps, s.b)
	log, entries, _, err := journal.Open(jp, ref)
	if err != nil {
		return err
	}
	defer log.Close()

	id := ""
	type state struct {
		end   int64
		state []byte
	}
	states := map[int]state{}
	for _, e := range entries {
		switch {
		case e.Unit == "upload":
			id = e.Commit
		case strings.HasPrefix(e.Unit, "part "):
			if n, err := strconv.Atoi(e.Unit[5:]); err == nil {
				states[n] = state{e.End, e.State}
			}
		}
	}
	have := map[int]Part{}
	if id != "" {
		parts, err := s.b.ListParts(ctx, key, id)
		if errors.Is(err, ErrNoUpload) {
			// Completed by an earlier run that stopped before it removed
			// the journal, or aborted (gc): start over unless the blob is
			// there.
			if ok, err := s.existing(ctx, d, size); ok || err != nil {
				if ok {
					progress(size)
					os.Remove(jp)
				}
				return err
			}
			id = ""
		} else if err != nil {
			return err
		}
		for _, p := range parts {
			have[p.Number] = p
		}
	}
	if id == "" {
		if id, err = s.b.CreateUpload(ctx, key); err != nil {
			return err
		}
		states = map[int]state{}
		if err := log.Reset(ref); err != nil {
			return err
		}
		if err := log.Append(journal.Entry{Unit: "upload", Commit: id}); err != nil {
			return err
		}
	}

	// Resume after the last part that the journal has a hash state for
	// and that the storage holds, with every part before it.
	first := 1
	h := hashing.NewWriter(nil)
	for k := nparts - 1; k >= 1 && !known; k-- {
		st, ok := states[k]
		if !ok || st.end != int64(k)*ps {
			continue
		}
		all := true
		for n := 1; n <= k; n++ {
			p, ok := have[n]
			if !ok || p.Size != ps {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		if rh, err := hashing.Resume(nil, st.state, st.end); err == nil {
			h, first = rh, k+1
			break
		}
	}
	parts := make([]Part, nparts)
	for n := 1; n < first; n++ {
		parts[n-1] = have[n]
	}
	progress(int64(first-1) * ps)

	// One reader hashes the blob in order and hands each part to an
	// uploader, which hashes the part; finished parts are journaled in
	// order. Buffers: UploadParallel+1, each also holding a token of the
	// store's parts in flight (Options.UploadInFlight).
	type job struct {
		n     int
		buf   []byte
		sum   [32]byte
		state []byte
	}
	g, gctx := errgroup.WithContext(ctx)
	own := make(chan struct{}, s.opt.UploadParallel+1)
	var held atomic.Int64 // the store's tokens this upload holds
	take := func() ([]byte, error) {
		select {
		case own <- struct{}{}:
		case <-gctx.Done():
			return nil, gctx.Err()
		}
		if s.uploads != nil {
			// The largest blob's parts first; but an upload with none
			// moving gets one before them, so that none waits for the
			// larger ones to end.
			prio := size
			if held.Load() == 0 {
				prio += firstPartPrio
			}
			if err := s.uploads.Acquire(gctx, prio); err != nil {
				<-own
				return nil, err
			}
			held.Add(1)
		}
		return s.partBuf(ps), nil
	}
	give := func(buf []byte) {
		s.bufs.Put(&buf)
		if s.uploads != nil {
			held.Add(-1)
			s.uploads.Release()
		}
		<-own
	}
	jobs := make(chan job)
	var mu sync.Mutex
	done := map[int][]byte{} // part number → hash state after it
	next := first            // the next part to journal
	// finish records part n durable; progress is told under the lock, so
	// it is never called concurrently.
	finish := func(n int, st []byte, bytes int64) error {
		mu.Lock()
		defer mu.Unlock()
		progress(bytes)
		done[n] = st
		for {
			st, ok := done[next]
			if !ok {
				return nil
			}
			delete(done, next)
			end := min(int64(next)*ps, size)
			if next < nparts && !known {
				if err := log.Append(journal.Entry{Unit: "part " + strconv.Itoa(next), End: end, State: st}); err != nil {
					return err
				}
			}
			next++
		}
	}
	g.Go(func() error {
		defer close(jobs)
		for n := first; n <= nparts; n++ {
			buf, err := take()
			if err != nil {
				return err
			}
			off := int64(n-1) * ps
			buf = buf[:min(ps, size-off)]
			if _, err := src.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
				give(buf)
				return fmt.Errorf("blob %s: read part %d at %d: %w", d.Short(), n, off, err)
			}
			j := job{n: n, buf: buf}
			if !known {
				h.Write(buf)
				j.state = h.State()
			}
			select {
			case jobs <- j:
			case <-gctx.Done():
				give(buf)
				return gctx.Err()
			}
		}
		return nil
	})
	// upload stores part j (unless the storage has it).
	upload := func(j job) error {
		core, err := s.partCore(gctx)
		if err != nil {
			return err
		}
		defer core(true)
		// The part's own SHA-256 here, in parallel: the reader's one pass
		// (the blob's digest, in order) is the limit.
		j.sum = sha256.Sum256(j.buf)
		core(false)
		p, ok := have[j.n]
		if !ok || p.SHA256 != j.sum || p.Size != int64(len(j.buf)) {
			if p, err = s.b.UploadPart(gctx, key, id, j.n, j.buf, j.sum); err != nil {
				return err
			}
		}
		core(true)
		parts[j.n-1] = p
		return nil
	}
	for range s.opt.UploadParallel {
		g.Go(func() error {
			for j := range jobs {
				err := upload(j)
				n := int64(len(j.buf))
				give(j.buf)
				if err != nil {
					return err
				}
				if err := finish(j.n, j.state, n); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if known {
		if err := unchanged(); err != nil {
			s.b.AbortUpload(ctx, key, id)
			os.Remove(jp)
			return fmt.Errorf("blob %s: the source changed while uploading (%v); upload dropped: %w", d.Short(), err, ErrDigestMismatch)
		}
	} else if got := digest.New(sumBytes(h)); got != d {
		s.b.AbortUpload(ctx, key, id)
		os.Remove(jp)
		return fmt.Errorf("blob %s: the source's bytes hash to %s (changed while uploading?); upload dropped: %w", d.Short(), got.Short(), ErrDigestMismatch)
	}
	_, err = s.b.CompleteUpload(ctx, key, id, parts, PutOptions{IfNoneMatch: true})
	if errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNoUpload) {
		// Another writer completed the same blob first (or this upload
		// was completed by a run that stopped before it forgot it).
		ok, herr := s.existing(ctx, d, size)
		if herr != nil {
			return herr
		}
		if !ok {
			return err
		}
		if errors.Is(err, ErrPrecondition) {
			s.b.AbortUpload(ctx, key, id)
		}
		err = nil
	}
	if err != nil {
		return err
	}
	log.Close()
	os.Remove(jp)
	return nil
}

// PutFile stores the file at path as the blob d (its SHA-256, known to the
// caller that wrote or hashed it).
func (s *Store) PutFile(ctx context.Context, d digest.Digest, path string, progress func(int64)) error {
	return s.putFile(ctx, d, path, nil, progress)
}

// PutKnownFile is PutFile for a file the caller has hashed to d and can
// tell unchanged since (a stamp of its size, times and inode): a blob over
// the part size is not hashed whole again, which held an upload to one
// core's SHA-256. Each part still carries its own SHA-256, which the
// storage checks, and unchanged is called once every part is stored and
// before the upload completes: its error drops the upload. Fetches hash
// every blob whole (FetchBlob), as verify does. A nil unchanged is PutFile.
func (s *Store) PutKnownFile(ctx context.Context, d digest.Digest, path string, unchanged func() error, progress func(int64)) error {
	return s.putFile(ctx, d, path, unchanged, progress)
}

func (s *Store) putFile(ctx context.Context, d digest.Digest, path string, unchanged func() error, progress func(int64)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fp, ok := s.b.(FilePutter); ok && d.Validate() == nil {
		// There already (a file:// store seeded again): no copy made and
		// hashed only to be refused.
		if ok, err := s.existing(ctx, d, fi.Size()); ok || err != nil {
			if ok && progress != nil {
				progress(fi.Size())
			}
			return err
		}
		_, err := fp.PutFile(ctx, BlobKey(d), path, sumOf(d))
		if errors.Is(err, ErrPrecondition) {
			ok, herr := s.existing(ctx, d, fi.Size())
			if herr != nil {
				return herr
			}
			if !ok {
				return fmt.Errorf("blob %s: create refused, yet the blob is not there: %w", d.Short(), err)
			}
			err = nil
		}
		if errors.Is(err, ErrBadDigest) {
			return fmt.Errorf("%s: its bytes are not blob %s: %w", path, d.Short(), ErrDigestMismatch)
		}
		if err == nil && progress != nil {
			progress(fi.Size())
		}
		return err
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if progress == nil {
		progress = func(int64) {}
	}
	switch {
	case unchanged == nil:
		err = s.PutBlob(ctx, d, f, fi.Size(), progress)
	case fi.Size() <= s.opt.PartSize:
		err = s.putSmall(ctx, d, f, fi.Size(), progress)
	default:
		err = s.putMultipart(ctx, d, f, fi.Size(), unchanged, progress)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadBlob reads a blob of at most max bytes whole and checks its digest.
func (s *Store) ReadBlob(ctx context.Context, d digest.Digest, max int64) ([]byte, error) {
	body, _, err := s.b.Get(ctx, BlobKey(d), max)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%s: blob %s: %w", s.b, d, ErrBlobMissing)
	}
	if err != nil {
		return nil, err
	}
	if got := digest.Of(body); got != d {
		return nil, fmt.Errorf("%s: blob %s: the storage returned bytes that hash to %s: %w", s.b, d, got.Short(), ErrDigestMismatch)
	}
	return body, nil
}

// FetchBlob copies the blob d to the file dst: ranged reads, Parallel at a
// time, written into dst.partial, hashed in order; at the end of the first
// chunk after every Options.CheckpointEvery, the file is fsynced and the
// point journaled (dst.partial.journal: its end and the sha256 state
// there), so a later FetchBlob resumes after it. dst appears
// only when the bytes hash to d; otherwise nothing is kept and the error
// is ErrDigestMismatch.
func (s *Store) FetchBlob(ctx context.Context, d digest.Digest, dst string, progress func(int64)) (err error) {
	if progress == nil {
		progress = func(int64) {}
	}
	defer func() {
		// Removed after its HEAD (a gc, a prune): missing, as before it.
		if errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBlobMissing) {
			err = fmt.Errorf("%s: blob %s removed while it was fetched: %w", s.b, d, ErrBlobMissing)
		}
	}()
	key := BlobKey(d)
	in, err := s.b.Head(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("%s: blob %s: %w", s.b, d, ErrBlobMissing)
	}
	if err != nil {
		return err
	}
	size := in.Size
	cs := s.opt.PartSize
	partial := dst + ".partial"
	unlock, err := machineLock(ctx, partial+".lock", "download of blob "+d.Short()+" to "+dst, "store fetch")
	if err != nil {
		return err
	}
	defer unlock()
	if fg, ok := s.b.(FileGetter); ok {
		return s.fetchFile(ctx, fg, d, key, dst, in, progress)
	}
	jp := partial + ".journal"
	ref := fmt.Sprintf("get %s size %d chunk %d from %s", d, size, cs, s.b)
	log, entries, _, err := journal.Open(jp, ref)
	if err != nil {
		return err
	}
	defer log.Close()
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	h := hashing.NewWriter(nil)
	var start int64
	if n := len(entries); n > 0 {
		e := entries[n-1]
		fi, serr := f.Stat()
		if rh, herr := hashing.Resume(nil, e.State, e.End); serr == nil && herr == nil && fi.Size() >= e.End && e.End%cs == 0 {
			h, start = rh, e.End
		} else if err := log.Reset(ref); err != nil {
			return err
		}
	}
	if err := f.Truncate(start); err != nil {
		return err
	}
	progress(start)

	last := time.Now()
	err = s.stream(ctx, key, start, size, func(off int64, buf []byte) error {
		if _, err := f.WriteAt(buf, off); err != nil {
			return fmt.Errorf("%s: %w", partial, err)
		}
		h.Write(buf)
		progress(int64(len(buf)))
		// A checkpoint at the first chunk's end after CheckpointEvery: an
		// fsync per chunk held a download to the disk's sync speed.
		if time.Since(last) < s.opt.CheckpointEvery || h.Size() == size {
			return nil
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("%s: fsync: %w", partial, err)
		}
		last = time.Now()
		return log.Append(journal.Entry{Unit: "chunk", End: h.Size(), State: h.State()})
	})
	if err != nil {
		return err
	}
	if sum := digest.New(sumBytes(h)); sum != d || h.Size() != size {
		f.Close()
		f = nil
		os.Remove(partial)
		log.Close()
		os.Remove(jp)
		return s.damaged(d, sum, h.Size(), in.ETag)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	f = nil
	if err := os.Rename(partial, dst); err != nil {
		return err
	}
	if err := fsutil.SyncDir(filepath.Dir(dst)); err != nil {
		return err
	}
	log.Close()
	os.Remove(jp)
	return nil
}

// partBuf is a buffer of n bytes for a part, one an earlier upload gave
// back if it is large enough.
func (s *Store) partBuf(n int64) []byte {
	if p, ok := s.bufs.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func sumBytes(h *hashing.Writer) []byte {
	sum := h.Sum()
	return sum[:]
}

// stream reads key's bytes from start to size in chunks of the part size,
// Parallel ranged reads at a time, and hands them to fn in order, from one
// goroutine; at most Parallel+1 chunks are held. fn must not keep buf.
func (s *Store) stream(ctx context.Context, key string, start, size int64, fn func(off int64, buf []byte) error) error {
	cs := s.opt.PartSize
	nchunks := int((size - start + cs - 1) / cs)
	type chunk struct {
		i   int
		buf []byte
	}
	pool := make(chan []byte, s.opt.Parallel+1)
	for range s.opt.Parallel + 1 {
		pool <- make([]byte, min(cs, size-start))
	}
	g, gctx := errgroup.WithContext(ctx)
	jobs := make(chan chunk)
	// got never blocks a reader: it holds as many chunks as there are
	// buffers.
	got := make(chan chunk, s.opt.Parallel+1)
	g.Go(func() error {
		defer close(jobs)
		for i := range nchunks {
			var buf []byte
			select {
			case buf = <-pool:
			case <-gctx.Done():
				return gctx.Err()
			}
			off := start + int64(i)*cs
			select {
			case jobs <- chunk{i, buf[:min(cs, size-off)]}:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range s.opt.Parallel {
		g.Go(func() error {
			for c := range jobs {
				if err := s.b.GetRange(gctx, key, start+int64(c.i)*cs, c.buf); err != nil {
					return err
				}
				got <- c
			}
			return nil
		})
	}
	g.Go(func() error {
		pending := map[int][]byte{}
		for next := 0; next < nchunks; {
			select {
			case c := <-got:
				pending[c.i] = c.buf
			case <-gctx.Done():
				return gctx.Err()
			}
			for {
				buf, ok := pending[next]
				if !ok {
					break
				}
				delete(pending, next)
				if err := fn(start+int64(next)*cs, buf); err != nil {
					return err
				}
				pool <- buf[:cap(buf)]
				next++
			}
		}
		return nil
	})
	return g.Wait()
}

// HashBlob re-reads the blob d (ranged reads, in parallel) and returns the
// SHA-256 of what the storage holds, and its size.
func (s *Store) HashBlob(ctx context.Context, d digest.Digest, progress func(int64)) (digest.Digest, int64, error) {
	_, got, n, err := s.hashBlob(ctx, d, progress)
	return got, n, err
}

// hashBlob is HashBlob, with the Info of the version it read.
func (s *Store) hashBlob(ctx context.Context, d digest.Digest, progress func(int64)) (Info, digest.Digest, int64, error) {
	if progress == nil {
		progress = func(int64) {}
	}
	key := BlobKey(d)
	in, err := s.b.Head(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return Info{}, "", 0, fmt.Errorf("%s: blob %s: %w", s.b, d, ErrBlobMissing)
	}
	if err != nil {
		return Info{}, "", 0, err
	}
	h := hashing.NewWriter(nil)
	err = s.stream(ctx, key, 0, in.Size, func(off int64, buf []byte) error {
		h.Write(buf)
		progress(int64(len(buf)))
		return nil
	})
	if err != nil {
		return Info{}, "", 0, err
	}
	return in, digest.New(sumBytes(h)), h.Size(), nil
}

// fetchFile is FetchBlob through a FileGetter: the copy is hashed before
// it gets its name.
func (s *Store) fetchFile(ctx context.Context, fg FileGetter, d digest.Digest, key, dst string, in Info, progress func(int64)) error {
	partial := dst + ".partial"
	if err := fg.GetFile(ctx, key, partial); err != nil {
		os.Remove(partial)
		return err
	}
	sum, n, err := hashing.File(ctx, partial, progress)
	if err != nil {
		os.Remove(partial)
		return err
	}
	if got := digest.New(sum[:]); got != d || n != in.Size {
		os.Remove(partial)
		return s.damaged(d, got, n, in.ETag)
	}
	if err := os.Rename(partial, dst); err != nil {
		return err
	}
	return fsutil.SyncDir(filepath.Dir(dst))
}

// pathLocks serialise the goroutines of this process that take one lock
// file: internal/lockfile excludes processes.
var pathLocks sync.Map // path → chan struct{} (capacity 1)

// machineLock takes the lock file at path for this machine, waiting for
// the goroutine or process that holds it, and returns its release.
func machineLock(ctx context.Context, path, what, command string) (func(), error) {
	v, _ := pathLocks.LoadOrStore(path, make(chan struct{}, 1))
	ch := v.(chan struct{})
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l, err := lockfile.Wait(ctx, path, what, command, 365*24*time.Hour)
	if err != nil {
		<-ch
		return nil, err
	}
	return func() { l.Unlock(); <-ch }, nil
}
