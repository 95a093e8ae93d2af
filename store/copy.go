package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// CopyReport is what Copy did.
type CopyReport struct {
	From         string `json:"from"`
	To           string `json:"to"`
	Records      int    `json:"records"`       // copied
	RecordsThere int    `json:"records_there"` // already in the destination
	Blobs        int    `json:"blobs"`         // copied (for records already there too: repaired)
	Bytes        int64  `json:"bytes"`         // copied
	// BlobsThere were in the destination with their size (listed, not
	// re-hashed: `ferry store verify` does that).
	BlobsThere    int           `json:"blobs_there"`
	Refs          int           `json:"refs"`       // copied
	RefsThere     int           `json:"refs_there"` // already the same there
	RefsConflicts []RefConflict `json:"refs_conflicts"`
	// Failed are the records (and refs) not copied, each with why; the
	// others are. Copy's error then says how many.
	Failed []CopyFailure `json:"failed"`
}

// RefConflict is a ref the destination holds with another value than the
// source: the destination's is kept.
type RefConflict struct {
	Name        string `json:"name"`
	Source      string `json:"source"`      // the record the source's ref names
	Destination string `json:"destination"` // the record the destination's names (kept)
}

// CopyFailure is a record or ref Copy could not copy.
type CopyFailure struct {
	Record string `json:"record,omitempty"`
	Output string `json:"output,omitempty"`
	Ref    string `json:"ref,omitempty"`
	Error  string `json:"error"`
}

func (f CopyFailure) String() string {
	switch {
	case f.Ref != "":
		return "ref " + f.Ref + ": " + f.Error
	case f.Output != "":
		return "record " + f.Record + ", output " + f.Output + ": " + f.Error
	}
	return "record " + f.Record + ": " + f.Error
}

// ErrCopyIncomplete reports a Copy that left records or refs out; the
// report says which and why.
var ErrCopyIncomplete = errkind.New(errkind.VerifyFailed, "store: copy incomplete")

// CopyOptions set up a Copy.
type CopyOptions struct {
	// Total is told once how many bytes the copy has to move.
	Total func(int64)
	// Progress is told of bytes moved: fetched from the source, or, from
	// a local directory, stored in the destination.
	Progress func(int64)
}

// copyPinTTL is the ttl of Copy's pin lease.
const copyPinTTL = time.Minute

// Copy copies every record of src, with the blobs it names, and every ref
// into dst.
//
//   - What dst has is listed once: a blob there with its size is not
//     copied again, a record there is not written again, but its blobs
//     are looked for too, so a copy run again puts back a blob that went
//     missing (a blob there with another size is damage, reported).
//   - A blob from a local directory is stored from its file; from a
//     bucket it is fetched verified (ranged, resumable) into a file, in
//     dst's own directory when dst is a local one (then moved into
//     place, not copied again), else in dst's cache directory; then
//     stored, its SHA-256 checked by the storage (multipart, resumable).
//   - A record is written only after its blobs, and a ref only when its
//     record is in dst. The blobs of the record being copied are
//     protected from a gc of dst (a pin lease) before they are looked for.
//   - A record that cannot be copied (a blob damaged in src, say) is
//     reported in Failed and the others are copied; the error is then
//     ErrCopyIncomplete. A ref dst holds with another value is kept and
//     reported.
//
// Run again after a kill, it continues.
func Copy(ctx context.Context, src, dst *Store, opt CopyOptions) (*CopyReport, error) {
	progress := opt.Progress
	if progress == nil {
		progress = func(int64) {}
	}
	rep := &CopyReport{From: src.String(), To: dst.String(), RefsConflicts: []RefConflict{}, Failed: []CopyFailure{}}
	var keys []string
	if err := src.Records(ctx, func(k string) error { keys = append(keys, k); return nil }); err != nil {
		return nil, err
	}
	have, _, err := dst.blobs(ctx)
	if err != nil {
		return nil, err
	}
	type item struct {
		r     *Record
		there bool // the record is in dst
	}
	var items []item
	need := map[digest.Digest]bool{}
	var total int64
	for _, k := range keys {
		r, err := src.Record(ctx, k)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			rep.Failed = append(rep.Failed, CopyFailure{Record: k, Error: err.Error()})
			continue
		}
		_, err = dst.b.Head(ctx, recordKey(k))
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		items = append(items, item{r: r, there: err == nil})
		for _, o := range r.Outputs {
			if in, ok := have[o.Digest]; (!ok || in.Size != o.Size) && !need[o.Digest] {
				need[o.Digest] = true
				total += o.Size
			}
		}
	}
	if opt.Total != nil {
		opt.Total(total)
	}
	// The blobs of the record being copied are protected from a gc of
	// dst before they are looked for (Lease.Protect).
	pin, err := dst.Pin(ctx, copyPinTTL)
	if err != nil {
		return nil, err
	}
	defer pin.Release(context.WithoutCancel(ctx))
	ctx = pin.Context()
	// stopped is the error of a copy that cannot go on: its context
	// ended (Ctrl-C), or its pin was lost (dst unreachable for long).
	stopped := func(err error) error {
		if lerr := pin.Err(); errors.Is(lerr, ErrLeaseLost) {
			return lerr
		}
		return err
	}
	counted := map[digest.Digest]bool{}
	for _, it := range items {
		r := it.r
		ds := make([]digest.Digest, 0, len(r.Outputs))
		for _, o := range r.Outputs {
			ds = append(ds, o.Digest)
		}
		if err := pin.ProtectOnly(ctx, ds...); err != nil {
			return nil, stopped(err)
		}
		// Listed before they were protected: a gc since may have taken
		// one no record named.
		for _, o := range r.Outputs {
			if _, ok := have[o.Digest]; !ok || counted[o.Digest] {
				continue
			}
			size, there, err := dst.HasBlob(ctx, o.Digest)
			if err != nil {
				return nil, stopped(err)
			}
			if !there {
				delete(have, o.Digest)
			} else {
				have[o.Digest] = Info{Key: BlobKey(o.Digest), Size: size}
			}
		}
		var fail *CopyFailure
	outputs:
		for _, o := range r.Outputs {
			in, ok := have[o.Digest]
			switch {
			case ok && in.Size == o.Size:
				if !counted[o.Digest] {
					rep.BlobsThere++
					counted[o.Digest] = true
				}
			case ok:
				fail = &CopyFailure{Record: r.Key, Output: o.Path, Error: fmt.Sprintf("%s holds blob %s with %d bytes, not %d: damaged there (delete it there and copy again)", dst, o.Digest.Short(), in.Size, o.Size)}
				break outputs
			default:
				if err := copyBlob(ctx, src, dst, o, progress); err != nil {
					if ctx.Err() != nil {
						return nil, stopped(err)
					}
					fail = &CopyFailure{Record: r.Key, Output: o.Path, Error: err.Error()}
					break outputs
				}
				have[o.Digest] = Info{Key: BlobKey(o.Digest), Size: o.Size}
				counted[o.Digest] = true
				rep.Blobs++
				rep.Bytes += o.Size
			}
		}
		if fail != nil {
			rep.Failed = append(rep.Failed, *fail)
			continue
		}
		if it.there {
			rep.RecordsThere++
			continue
		}
		// The record as it stands in src, whoever made it.
		if _, err := dst.CommitRecord(ctx, r); err != nil {
			if !errors.Is(err, ErrRecordExists) {
				if ctx.Err() != nil {
					return nil, stopped(err)
				}
				rep.Failed = append(rep.Failed, CopyFailure{Record: r.Key, Error: err.Error()})
				continue
			}
			rep.RecordsThere++
			continue
		}
		rep.Records++
	}
	if err := copyRefs(ctx, src, dst, rep); err != nil {
		return nil, stopped(err)
	}
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("%s -> %s: %d not copied (the rest is): %s: %w", src, dst, len(rep.Failed), rep.Failed[0], ErrCopyIncomplete)
	}
	return rep, nil
}

// copyRefs copies src's refs into dst: each only when dst has the record
// it names; one dst holds with another value is kept and reported.
func copyRefs(ctx context.Context, src, dst *Store, rep *CopyReport) error {
	var refs []string
	if err := src.b.List(ctx, "refs/", func(in Info) error {
		refs = append(refs, strings.TrimPrefix(in.Key, "refs/"))
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(refs)
	for _, name := range refs {
		r, err := src.GetRef(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		have, err := dst.GetRef(ctx, name)
		switch {
		case err == nil && have.Value == r.Value:
			rep.RefsThere++
			continue
		case err == nil:
			rep.RefsConflicts = append(rep.RefsConflicts, RefConflict{Name: name, Source: r.Value, Destination: have.Value})
			continue
		case !errors.Is(err, ErrNotFound):
			return err
		}
		if _, err := dst.b.Head(ctx, recordKey(r.Value)); errors.Is(err, ErrNotFound) {
			rep.Failed = append(rep.Failed, CopyFailure{Ref: name, Error: "the record it names, " + r.Value + ", is not in " + dst.String()})
			continue
		} else if err != nil {
			return err
		}
		if _, err := dst.SetRef(ctx, name, r.Value, nil); err != nil {
			if !errors.Is(err, ErrRefConflict) {
				return err
			}
			// Set there meanwhile, by another copy or a run.
			have, gerr := dst.GetRef(ctx, name)
			switch {
			case gerr != nil:
				return gerr
			case have.Value == r.Value:
				rep.RefsThere++
			default:
				rep.RefsConflicts = append(rep.RefsConflicts, RefConflict{Name: name, Source: r.Value, Destination: have.Value})
			}
			continue
		}
		rep.Refs++
	}
	return nil
}

// copyBlob stores the blob of o, read from src, in dst. Copies of one
// blob on this machine take turns (a lock beside the file it goes
// through), and one that finds it stored by another is done.
func copyBlob(ctx context.Context, src, dst *Store, o Output, progress func(int64)) error {
	// From a local directory: stored from its file, nothing in between.
	if lf, ok := src.b.(LocalFiler); ok {
		p, err := lf.LocalFile(BlobKey(o.Digest))
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("%s: blob %s: %w", src, o.Digest.Short(), ErrBlobMissing)
		}
		if err != nil {
			return err
		}
		return dst.PutFile(ctx, o.Digest, p, progress)
	}
	// Into a local directory: fetched (verified) beside it and linked in;
	// else through a file in dst's cache directory (one per store: two
	// copies into two buckets keep their own).
	fa, local := dst.b.(FileAdopter)
	var tmp string
	if local {
		dir, err := fa.TempDir()
		if err != nil {
			return err
		}
		tmp = filepath.Join(dir, "copy-"+o.Digest.Hex())
	} else {
		id := sha256.Sum256([]byte(dst.b.String()))
		dir := filepath.Join(dst.opt.CacheDir, "copy", hex.EncodeToString(id[:8]))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		tmp = filepath.Join(dir, o.Digest.Hex())
	}
	unlock, err := machineLock(ctx, tmp+".lock", "copy of blob "+o.Digest.Short()+" to "+dst.String(), "store copy")
	if err != nil {
		return err
	}
	defer unlock()
	if size, there, err := dst.HasBlob(ctx, o.Digest); err != nil || there && size == o.Size {
		return err
	}
	// A file fetched whole by a copy whose store step failed is used
	// again (FetchBlob resumes a partial one).
	if fi, err := os.Stat(tmp); err != nil || fi.Size() != o.Size {
		if err := src.FetchBlob(ctx, o.Digest, tmp, progress); err != nil {
			return err
		}
	} else {
		progress(o.Size)
	}
	if local {
		_, err = fa.AdoptFile(ctx, BlobKey(o.Digest), tmp)
		if errors.Is(err, ErrPrecondition) {
			err = nil // stored meanwhile, by a run
		}
	} else {
		err = dst.PutFile(ctx, o.Digest, tmp, nil)
	}
	if err == nil {
		os.Remove(tmp)
	}
	return err
}
