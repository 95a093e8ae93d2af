package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// blobs lists the blobs: each digest with its Info. A key under blobs/
// that is not a digest is returned in bad.
func (s *Store) blobs(ctx context.Context) (map[digest.Digest]Info, []string, error) {
	out := map[digest.Digest]Info{}
	var bad []string
	err := s.b.List(ctx, "blobs/", func(in Info) error {
		d, ok := blobOfKey(in.Key)
		if !ok {
			bad = append(bad, in.Key)
			return nil
		}
		out[d] = in
		return nil
	})
	return out, bad, err
}

// blobOfKey is the digest whose blob key is key (BlobKey), if it is one.
func blobOfKey(key string) (digest.Digest, bool) {
	h, ok := strings.CutPrefix(key, "blobs/"+digest.Algorithm+"/")
	d, err := digest.FromHex(h)
	return d, ok && err == nil
}

// Temp is TempKeeper.Temp on the storage: its temp files on this
// machine (none but where the backend is a TempKeeper).
func (s *Store) Temp(ctx context.Context, olderThan time.Duration, remove bool) (TempReport, error) {
	if tk, ok := s.b.(TempKeeper); ok {
		return tk.Temp(ctx, olderThan, remove)
	}
	return TempReport{}, nil
}

// ownUploads lists the unfinished uploads the store made: a blob's, or
// the probe's scratch. Others under its prefix (an upload by another
// tool, `ferry transfer` into the same bucket) are not the store's to
// count or abort.
func (s *Store) ownUploads(ctx context.Context, fn func(Upload) error) error {
	for _, prefix := range []string{"blobs/", probePrefix} {
		err := s.b.ListUploads(ctx, prefix, func(u Upload) error {
			if _, ok := blobOfKey(u.Key); !ok && !strings.HasPrefix(u.Key, probePrefix) {
				return nil
			}
			return fn(u)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// gcLease is the lease GC holds while it runs.
const gcLease = "gc"

// records reads every record; unreadable ones are returned as problems.
func (s *Store) records(ctx context.Context) ([]*Record, []Problem, error) {
	var keys []string
	if err := s.Records(ctx, func(k string) error { keys = append(keys, k); return nil }); err != nil {
		return nil, nil, err
	}
	var recs []*Record
	var probs []Problem
	for _, k := range keys {
		r, err := s.Record(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, err
			}
			probs = append(probs, Problem{Record: k, What: err.Error()})
			continue
		}
		recs = append(recs, r)
	}
	return recs, probs, nil
}

// liveLeases reads every lease; the live ones (neither released nor
// expired by the storage's clock) are returned, and the unreadable ones
// (which do not parse) with their objects' ages by that clock.
func (s *Store) liveLeases(ctx context.Context) ([]LeaseUse, []unreadableLease, error) {
	var names []string
	if err := s.b.List(ctx, "leases/", func(in Info) error {
		names = append(names, strings.TrimPrefix(in.Key, "leases/"))
		return nil
	}); err != nil {
		return nil, nil, err
	}
	var live []LeaseUse
	var bad []unreadableLease
	for _, n := range names {
		li, in, err := s.readLease(ctx, n)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		age := in.Date.Sub(in.Modified)
		switch {
		case li.Unreadable:
			bad = append(bad, unreadableLease{name: n, age: age})
		case !li.Released && age <= li.TTL():
			live = append(live, LeaseUse{Name: n, Holder: li.Holder, Until: time.Now().Add(li.TTL() - age), Blobs: li.Blobs})
		}
	}
	return live, bad, nil
}

// unreadableLease is a lease object that does not parse, and its age.
type unreadableLease struct {
	name string
	age  time.Duration
}

// Problem is one thing verify found wrong.
type Problem struct {
	Blob   digest.Digest `json:"blob,omitempty"`
	Record string        `json:"record,omitempty"`
	Output string        `json:"output,omitempty"` // the record's output that names Blob
	Key    string        `json:"key,omitempty"`    // an object under blobs/ not named by a digest
	Ref    string        `json:"ref,omitempty"`    // a ref that names no record the store holds
	What   string        `json:"what"`
	// Records and Refs, for a blob whose bytes do not hash to its name:
	// the records that name it and the refs (pipelines/PIPELINE/STAGE)
	// that point at those, so the user knows which stages it breaks.
	Records []string `json:"records,omitempty"`
	Refs    []string `json:"refs,omitempty"`
	// Removed: VerifyOptions.Repair removed that blob.
	Removed bool `json:"removed,omitempty"`
	// Err is ErrBlobMissing, ErrSizeMismatch or ErrDigestMismatch, where
	// the problem is one of those.
	Err error `json:"-"`
}

// ErrSizeMismatch reports a blob whose size is not the one a record
// gives it.
var ErrSizeMismatch = errors.New("store: the blob's size is not the record's")

func (p Problem) String() string {
	switch {
	case p.Record != "":
		return "record " + p.Record + ": " + p.What
	case p.Blob != "":
		return "blob " + string(p.Blob) + ": " + p.What
	case p.Ref != "":
		return "ref " + p.Ref + ": " + p.What
	}
	return p.What
}

// VerifyReport is what Verify found.
type VerifyReport struct {
	Store        string    `json:"store"`
	Blobs        int       `json:"blobs"`
	Bytes        int64     `json:"bytes"`
	Records      int       `json:"records"`
	Unreferenced int       `json:"unreferenced_blobs"`
	Problems     []Problem `json:"problems"`
}

// OK reports whether nothing is wrong.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// VerifyOptions set up a VerifyWith.
type VerifyOptions struct {
	// Progress, when set, is told of bytes re-hashed (one call at a time).
	Progress func(int64)
	// Parallel is how many blobs are hashed at once (1 when 0).
	Parallel int
	// Also are records kept outside the store, checked as its own are:
	// a pipeline directory's imports, which name this machine's files
	// and are never objects.
	Also []*Record
	// Blob, when set, is told of each blob hashed: the digest its bytes
	// hash to and their count (one call at a time). A cache on the same
	// files stamps the good ones.
	Blob func(d, got digest.Digest, size int64)
	// Repair removes each blob whose bytes do not hash to its name,
	// hashed a second time with the same answer, by a delete conditional
	// on the version hashed. The records that name it are left: they
	// then name a missing blob, and the next run that needs one of their
	// stages makes it again and stores the blob again (a blob is
	// create-only, so a damaged one stands until it is removed).
	Repair bool
}

// Verify re-hashes every blob as the storage returns it (ranged reads)
// and checks that every record's outputs are stored with their sizes.
// progress is told of bytes re-hashed.
func (s *Store) Verify(ctx context.Context, progress func(int64)) (*VerifyReport, error) {
	return s.VerifyWith(ctx, VerifyOptions{Progress: progress})
}

// VerifyWith is Verify as opt sets it up.
func (s *Store) VerifyWith(ctx context.Context, opt VerifyOptions) (*VerifyReport, error) {
	var mu sync.Mutex
	progress := func(n int64) {
		if opt.Progress != nil {
			mu.Lock()
			opt.Progress(n)
			mu.Unlock()
		}
	}
	rep := &VerifyReport{Store: s.b.String(), Problems: []Problem{}}
	blobs, bad, err := s.blobs(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range bad {
		rep.Problems = append(rep.Problems, Problem{Key: k, What: "object " + k + " under blobs/ is not named by a digest"})
	}
	recs, probs, err := s.records(ctx)
	if err != nil {
		return nil, err
	}
	rep.Problems = append(rep.Problems, probs...)
	rep.Records = len(recs) + len(probs) + len(opt.Also)
	recs = append(recs, opt.Also...)
	refProbs, err := s.checkRefs(ctx, recs, probs)
	if err != nil {
		return nil, err
	}
	rep.Problems = append(rep.Problems, refProbs...)
	referenced := map[digest.Digest]bool{}
	for _, r := range recs {
		for _, o := range r.Outputs {
			referenced[o.Digest] = true
			in, ok := blobs[o.Digest]
			switch {
			case !ok:
				rep.Problems = append(rep.Problems, Problem{Record: r.Key, Blob: o.Digest, Output: o.Path, What: fmt.Sprintf("output %s (blob %s): %v", o.Path, o.Digest, ErrBlobMissing), Err: ErrBlobMissing})
			case in.Size != o.Size:
				rep.Problems = append(rep.Problems, Problem{Record: r.Key, Blob: o.Digest, Output: o.Path, What: fmt.Sprintf("output %s: blob holds %d bytes, the record says %d", o.Path, in.Size, o.Size), Err: ErrSizeMismatch})
			}
		}
	}
	ds := make([]digest.Digest, 0, len(blobs))
	for d := range blobs {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	// Hashed side by side; reported in digest order.
	type hashed struct {
		got  digest.Digest
		size int64
		gone bool
		etag string
	}
	res := make([]hashed, len(ds))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(opt.Parallel, 1))
	for i, d := range ds {
		g.Go(func() error {
			in, got, size, err := s.hashBlob(gctx, d, progress)
			if errors.Is(err, ErrBlobMissing) {
				res[i].gone = true // removed since the listing (gc)
				return nil
			}
			if err != nil {
				return err
			}
			res[i] = hashed{got: got, size: size, etag: in.ETag}
			if opt.Blob != nil {
				mu.Lock()
				opt.Blob(d, got, size)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var refs map[string][]string
	for i, d := range ds {
		r := res[i]
		if r.gone {
			continue
		}
		rep.Blobs++
		rep.Bytes += r.size
		if r.got != d {
			if refs == nil {
				if refs, err = s.refsByRecord(ctx); err != nil {
					return nil, err
				}
			}
			p := Problem{Blob: d, What: fmt.Sprintf("the storage returns %d bytes that hash to %s: %v", r.size, r.got, ErrDigestMismatch), Err: ErrDigestMismatch}
			for _, rec := range recs {
				if rec.names(d) {
					p.Records = append(p.Records, rec.Key)
					p.Refs = append(p.Refs, refs[rec.Key]...)
				}
			}
			sort.Strings(p.Refs)
			if opt.Repair {
				if err := s.removeDamaged(ctx, d, r.got, r.etag); err != nil {
					if ctx.Err() != nil {
						return nil, err
					}
					p.What += "; not removed: " + err.Error()
				} else {
					p.Removed = true
				}
			}
			rep.Problems = append(rep.Problems, p)
		}
		if !referenced[d] {
			rep.Unreferenced++
		}
	}
	return rep, nil
}

// checkRefs finds the refs that name no record the store holds (recs
// read, unreadable those in probs, which verify reports itself).
func (s *Store) checkRefs(ctx context.Context, recs []*Record, unreadable []Problem) ([]Problem, error) {
	have := map[string]bool{}
	for _, r := range recs {
		have[r.Key] = true
	}
	for _, p := range unreadable {
		have[p.Record] = true
	}
	var out []Problem
	err := s.b.List(ctx, "refs/", func(in Info) error {
		name := strings.TrimPrefix(in.Key, "refs/")
		ref, err := s.GetRef(ctx, name)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil // deleted since the listing
		case err != nil && ctx.Err() == nil && errkind.Of(err) != errkind.Retryable:
			out = append(out, Problem{Ref: name, What: err.Error()})
			return nil
		case err != nil:
			return err
		}
		switch {
		case checkName("record", ref.Value) != nil:
			out = append(out, Problem{Ref: name, What: fmt.Sprintf("holds %q, not a record key (the next run of its stage points it again)", ref.Value)})
		case !have[ref.Value]:
			// A record written after the listing is read to be sure.
			if _, err := s.Record(ctx, ref.Value); errors.Is(err, ErrNotFound) {
				out = append(out, Problem{Ref: name, What: fmt.Sprintf("names record %s, which is not in the store (the next run of its stage points it again)", ref.Value)})
			}
		}
		return nil
	})
	return out, err
}

// names reports whether one of r's outputs is blob d.
func (r *Record) names(d digest.Digest) bool {
	for _, o := range r.Outputs {
		if o.Digest == d {
			return true
		}
	}
	return false
}

// removeDamaged removes blob d, which hashed to first, another digest, as
// the version etag: hashed once more first, and removed only when that
// gives first again (a read damaged on its way here, by a flaky link or
// this machine's memory, gives d or yet another digest) and the blob is
// still that version.
func (s *Store) removeDamaged(ctx context.Context, d, first digest.Digest, etag string) error {
	in, got, _, err := s.hashBlob(ctx, d, nil)
	if errors.Is(err, ErrBlobMissing) || errors.Is(err, ErrNotFound) {
		return nil // removed since (another repair), before or while read
	}
	if err != nil {
		return err
	}
	if got == d {
		return errors.New("hashed again, it is whole (the first read was damaged on its way here)")
	}
	if got != first {
		return fmt.Errorf("hashed again, it gives %s, not %s: the reads, not the blob, may be damaged", got.Short(), first.Short())
	}
	if in.ETag != etag {
		return errors.New("replaced while it was read")
	}
	if err := s.b.Delete(ctx, BlobKey(d), etag); err != nil && !errors.Is(err, ErrNotFound) {
		if errors.Is(err, ErrPrecondition) {
			return errors.New("replaced while it was read")
		}
		return err
	}
	return nil
}

// refsByRecord maps each record key to the refs that point at it.
func (s *Store) refsByRecord(ctx context.Context) (map[string][]string, error) {
	refs := map[string][]string{}
	err := s.b.List(ctx, "refs/", func(in Info) error {
		name := strings.TrimPrefix(in.Key, "refs/")
		ref, err := s.GetRef(ctx, name)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		refs[ref.Value] = append(refs[ref.Value], name)
		return nil
	})
	return refs, err
}

// LeaseUse is a live lease, as du and gc report it.
type LeaseUse struct {
	Name   string          `json:"name"`
	Holder string          `json:"holder"`
	Until  time.Time       `json:"until"`
	Blobs  []digest.Digest `json:"blobs,omitempty"`
}

// Usage is what DiskUsage found.
type Usage struct {
	Store             string `json:"store"`
	Blobs             int    `json:"blobs"`
	BlobBytes         int64  `json:"blob_bytes"`
	Records           int    `json:"records"`
	UnreferencedBlobs int    `json:"unreferenced_blobs"`
	UnreferencedBytes int64  `json:"unreferenced_bytes"`
	MissingBlobs      int    `json:"missing_blobs"` // named by records, not stored
	Uploads           int    `json:"unfinished_uploads"`
	// TempFiles and TempBytes: a directory store's temp files on this
	// machine (a copy's fetch cut short), which gc removes past its
	// grace period.
	TempFiles int        `json:"temp_files"`
	TempBytes int64      `json:"temp_bytes"`
	Leases    []LeaseUse `json:"live_leases"`
	// ByRecord is what each record names, those refs point at first.
	ByRecord []RecordUsage `json:"by_record"`
	// Unreadable are records that could not be read (verify says why);
	// the blobs only they name count as unreferenced.
	Unreadable []string `json:"unreadable_records,omitempty"`
}

// RecordUsage is what one record's outputs hold in the store.
type RecordUsage struct {
	Key  string   `json:"key"`
	Host string   `json:"host,omitempty"` // the machine that made it
	Refs []string `json:"refs,omitempty"` // the refs that name it
	// Bytes counts its stored outputs (each blob whole); SharedBytes the
	// part other records name too; Missing its outputs not stored.
	Bytes       int64 `json:"bytes"`
	SharedBytes int64 `json:"shared_bytes"`
	Missing     int   `json:"missing,omitempty"`
}

// DiskUsage counts what the store holds, from listings (no data read).
func (s *Store) DiskUsage(ctx context.Context) (*Usage, error) {
	u := &Usage{Store: s.b.String(), Leases: []LeaseUse{}}
	blobs, _, err := s.blobs(ctx)
	if err != nil {
		return nil, err
	}
	recs, probs, err := s.records(ctx)
	if err != nil {
		return nil, err
	}
	u.Records = len(recs) + len(probs)
	for _, p := range probs {
		u.Unreadable = append(u.Unreadable, p.Record)
	}
	referenced := map[digest.Digest]bool{}
	holders := map[digest.Digest]int{}
	for _, r := range recs {
		seen := map[digest.Digest]bool{}
		for _, o := range r.Outputs {
			if _, ok := blobs[o.Digest]; !ok && !referenced[o.Digest] {
				u.MissingBlobs++
			}
			referenced[o.Digest] = true
			if !seen[o.Digest] {
				holders[o.Digest]++
				seen[o.Digest] = true
			}
		}
	}
	refs, err := s.refsByRecord(ctx)
	if err != nil {
		return nil, err
	}
	u.ByRecord = []RecordUsage{}
	for _, r := range recs {
		ru := RecordUsage{Key: r.Key, Host: r.Host, Refs: refs[r.Key]}
		sort.Strings(ru.Refs)
		seen := map[digest.Digest]bool{}
		for _, o := range r.Outputs {
			if seen[o.Digest] {
				continue
			}
			seen[o.Digest] = true
			in, ok := blobs[o.Digest]
			if !ok {
				ru.Missing++
				continue
			}
			ru.Bytes += in.Size
			if holders[o.Digest] > 1 {
				ru.SharedBytes += in.Size
			}
		}
		u.ByRecord = append(u.ByRecord, ru)
	}
	sort.SliceStable(u.ByRecord, func(i, j int) bool {
		a, b := u.ByRecord[i], u.ByRecord[j]
		if (len(a.Refs) > 0) != (len(b.Refs) > 0) {
			return len(a.Refs) > 0
		}
		if len(a.Refs) > 0 && a.Refs[0] != b.Refs[0] {
			return a.Refs[0] < b.Refs[0]
		}
		return a.Key < b.Key
	})
	for d, in := range blobs {
		u.Blobs++
		u.BlobBytes += in.Size
		if !referenced[d] {
			u.UnreferencedBlobs++
			u.UnreferencedBytes += in.Size
		}
	}
	if err := s.ownUploads(ctx, func(Upload) error { u.Uploads++; return nil }); err != nil {
		return nil, err
	}
	tr, err := s.Temp(ctx, 0, false)
	if err != nil {
		return nil, err
	}
	u.TempFiles, u.TempBytes = tr.Files, tr.Bytes
	if u.Leases, _, err = s.liveLeases(ctx); err != nil {
		return nil, err
	}
	if u.Leases == nil {
		u.Leases = []LeaseUse{}
	}
	return u, nil
}

// GCOptions set up a GC.
type GCOptions struct {
	// Grace: blobs and uploads younger than this (by the storage's clock)
	// are kept, whatever refers to them: a stage may have stored a blob
	// and not yet named it in its lease. At least twice the lease ttl the
	// stages use; DefaultGCGrace when 0.
	Grace time.Duration
	// DryRun removes nothing.
	DryRun bool
	// Keep are blobs named by records kept outside the store (a pipeline
	// directory's imports): kept as the records' own are.
	Keep []digest.Digest
	// Exclusive: the caller holds the store's exclusive lock (a pipeline
	// directory's), so no stage of a run on it is writing beside it:
	// blobs get no grace period. The gc lease is still taken (waited
	// for) and live leases still read: a machine that
	// shares the directory as file:// writes under leases, not under the
	// lock. Unfinished uploads still get Grace (a killed copy resumes
	// from them).
	Exclusive bool
	// Removed, when set, is told of each blob removed (or, with DryRun,
	// that would be).
	Removed func(d digest.Digest, in Info)
	// PruneRecords first drops the records no ref names (the results of
	// earlier parameters or inputs), written more than Grace ago by the
	// storage's clock and whose stage key no live lease holds; then the
	// blobs only they named go as any unreferenced blob does. A machine
	// that still uses one makes or shares it again on its next run.
	PruneRecords bool
}

// DefaultGCGrace is GCOptions.Grace's default.
const DefaultGCGrace = time.Hour

// GCReport is what GC did.
type GCReport struct {
	Store          string `json:"store"`
	Records        int    `json:"records"`
	RemovedBlobs   int    `json:"removed_blobs"`
	RemovedBytes   int64  `json:"removed_bytes"`
	KeptBlobs      int    `json:"kept_blobs"`
	KeptYoung      int    `json:"kept_young_blobs"`  // unreferenced, within the grace period
	KeptLeased     int    `json:"kept_leased_blobs"` // unreferenced, named by a live lease
	AbortedUploads int    `json:"aborted_uploads"`
	// RemovedScratch: objects a store probe killed mid-way left under
	// probe/, older than the grace period.
	RemovedScratch int `json:"removed_scratch_objects"`
	// RemovedTemp(Bytes): temp files on this machine (a directory
	// store's: a copy's fetch cut short) older than the grace period.
	RemovedTemp      int   `json:"removed_temp_files"`
	RemovedTempBytes int64 `json:"removed_temp_bytes"`
	// RemovedLeases: released or expired leases past the grace period,
	// removed by a delete conditional on the version read (only where the
	// probe found conditional deletes honoured).
	RemovedLeases int `json:"removed_leases"`
	// RemovedMarks: marks (Lease.Mark) past the grace period whose leases
	// are not live, removed the same way.
	RemovedMarks int `json:"removed_marks"`
	// PrunedRecords: records GCOptions.PruneRecords dropped (or, with
	// DryRun, would).
	PrunedRecords int        `json:"pruned_records,omitempty"`
	Leases        []LeaseUse `json:"live_leases"`
	DryRun        bool       `json:"dry_run,omitempty"`
}

// ErrGCUnsure reports a gc that stopped because it could not read every
// record or lease: it deletes nothing it cannot prove unreferenced. The
// store is damaged there (exit 3).
var ErrGCUnsure = errkind.New(errkind.VerifyFailed, "store: gc stopped: a record or lease could not be read")

// GC removes blobs no record names, no live lease protects and that are
// older than the grace period, and unfinished uploads older than it
// that no live lease protects. It holds the lease "gc" while it runs.
// That lease is taken before leases are read, leases before records and
// records before blobs:
//   - a stage that commits its record and releases its lease while gc
//     runs is seen by one of the two;
//   - a writer protects the blobs of a record in its lease before it
//     looks whether they are stored, then waits while a gc holds its
//     lease (Lease.Protect): either this gc read its protection, or the
//     writer waited for this gc to end before it reused a stored blob.
func (s *Store) GC(ctx context.Context, opt GCOptions) (*GCReport, error) {
	if opt.Grace <= 0 {
		opt.Grace = DefaultGCGrace
	}
	rep := &GCReport{Store: s.b.String(), DryRun: opt.DryRun, Leases: []LeaseUse{}}
	acquire := s.AcquireLease
	if opt.Exclusive {
		// Under the store's lock: a gc holding the lease is another
		// machine's on a directory shared as file:// (waited for), or a
		// killed one of this directory's (taken over at once with
		// Options.ResumeLeases, else after its ttl).
		acquire = func(ctx context.Context, name string, ttl time.Duration) (*Lease, error) {
			return s.WaitLease(ctx, name, ttl, 0, nil)
		}
	}
	leaseErr := func() error { return nil }
	if !opt.DryRun {
		// A dry run writes nothing, its lease included.
		lease, err := acquire(ctx, gcLease, time.Minute)
		if err != nil {
			return nil, err
		}
		defer lease.Release(context.WithoutCancel(ctx))
		ctx, leaseErr = lease.Context(), lease.Err
	}
	live, unreadable, err := s.liveLeases(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range unreadable {
		// What it protected cannot be told, nor its ttl: once it is
		// older than the grace period, and than the default one whatever
		// --grace says (a live lease is renewed every third of its ttl),
		// it protects nothing.
		if wait := max(opt.Grace, DefaultGCGrace); l.age <= wait {
			return nil, fmt.Errorf("%s: %w: lease %s does not parse and was written %v ago, less than %v ago: it may protect a stage's blobs (gc can run once it is older, or remove %s if no machine is making that stage)",
				s.b, ErrGCUnsure, l.name, l.age.Round(time.Second), wait, leaseKey(l.name))
		}
	}
	if err := s.removeOldLeases(ctx, opt, rep); err != nil {
		return nil, err
	}
	if err := s.removeOldMarks(ctx, opt, rep); err != nil {
		return nil, err
	}
	protected := map[digest.Digest]bool{}
	for _, l := range live {
		if l.Name == gcLease {
			continue // this one's
		}
		rep.Leases = append(rep.Leases, l)
		for _, d := range l.Blobs {
			protected[d] = true
		}
	}
	recs, probs, err := s.records(ctx)
	if err != nil {
		return nil, err
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("%s: %w: %s", s.b, ErrGCUnsure, probs[0])
	}
	rep.Records = len(recs)
	if opt.PruneRecords {
		if recs, err = s.pruneRecords(ctx, recs, live, opt, rep); err != nil {
			return nil, err
		}
	}
	referenced := map[digest.Digest]bool{}
	for _, r := range recs {
		for _, o := range r.Outputs {
			referenced[o.Digest] = true
		}
	}
	for _, d := range opt.Keep {
		referenced[d] = true
	}
	blobs, _, err := s.blobs(ctx)
	if err != nil {
		return nil, err
	}
	ds := make([]digest.Digest, 0, len(blobs))
	for d := range blobs {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	for _, d := range ds {
		in := blobs[d]
		switch {
		case referenced[d]:
			rep.KeptBlobs++
		case protected[d]:
			rep.KeptLeased++
		case !opt.Exclusive && in.Date.Sub(in.Modified) < opt.Grace:
			rep.KeptYoung++
		default:
			if !opt.DryRun {
				if err := s.b.Delete(ctx, BlobKey(d), ""); err != nil {
					return nil, err
				}
			}
			rep.RemovedBlobs++
			rep.RemovedBytes += in.Size
			if opt.Removed != nil {
				opt.Removed(d, in)
			}
		}
	}
	// The storage's clock now: the format object's answer.
	now, err := s.b.Head(ctx, "format")
	if err != nil {
		return nil, err
	}
	var stale []Upload
	if err := s.ownUploads(ctx, func(u Upload) error {
		// An upload a live lease protects is going on, however long it
		// has taken (a slow link, a resume after a kill).
		if d, ok := blobOfKey(u.Key); ok && protected[d] {
			return nil
		}
		if !u.Initiated.IsZero() && now.Date.Sub(u.Initiated) > opt.Grace {
			stale = append(stale, u)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	// A probe killed before it cleaned up left scratch objects.
	var scratch []string
	if err := s.b.List(ctx, probePrefix, func(in Info) error {
		if now.Date.Sub(in.Modified) > opt.Grace {
			scratch = append(scratch, in.Key)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	for _, k := range scratch {
		if !opt.DryRun {
			if err := s.b.Delete(ctx, k, ""); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, err
			}
		}
		rep.RemovedScratch++
	}
	for _, u := range stale {
		if !opt.DryRun {
			if err := s.b.AbortUpload(ctx, u.Key, u.ID); err != nil && !errors.Is(err, ErrNoUpload) {
				return nil, err
			}
		}
		rep.AbortedUploads++
	}
	// Past the grace period too: a killed copy resumes from them.
	tr, err := s.Temp(ctx, opt.Grace, !opt.DryRun)
	if err != nil {
		return nil, err
	}
	rep.RemovedTemp, rep.RemovedTempBytes = tr.Removed, tr.RemovedBytes
	return rep, leaseErr()
}

// pruneRecords drops the records of recs that GCOptions.PruneRecords
// names, and returns those that stay. Each is deleted as the version
// listed where the listing gives versions (S3): one written again
// meanwhile stays. A machine that points a ref at a record this gc
// removes finds it gone once the gc ends, and shares it again.
func (s *Store) pruneRecords(ctx context.Context, recs []*Record, live []LeaseUse, opt GCOptions, rep *GCReport) ([]*Record, error) {
	refs, err := s.refsByRecord(ctx)
	if err != nil {
		return nil, err
	}
	leased := map[string]bool{}
	for _, l := range live {
		leased[l.Name] = true
	}
	infos := map[string]Info{}
	if err := s.b.List(ctx, "records/", func(in Info) error {
		infos[in.Key] = in
		return nil
	}); err != nil {
		return nil, err
	}
	var keep []*Record
	for _, r := range recs {
		in, listed := infos[recordKey(r.Key)]
		// A pipeline makes a stage's key under the lease stage/KEY.
		if len(refs[r.Key]) > 0 || leased["stage/"+r.Key] || !listed || in.Date.Sub(in.Modified) <= opt.Grace {
			keep = append(keep, r)
			continue
		}
		if !opt.DryRun {
			err := s.b.Delete(ctx, recordKey(r.Key), in.ETag)
			if errors.Is(err, ErrPrecondition) {
				keep = append(keep, r) // written again since the listing
				continue
			}
			if err != nil && !errors.Is(err, ErrNotFound) {
				return nil, err
			}
		}
		rep.PrunedRecords++
	}
	return keep, nil
}

// removeOldLeases deletes lease objects that are released or expired and
// were last written more than the grace period ago, each by a delete
// conditional on the version read: a machine taking the lease over at the
// same moment replaces that version, and then the delete is refused (or
// the takeover is, and it creates the lease anew). Storage that ignores
// conditional deletes keeps its leases.
func (s *Store) removeOldLeases(ctx context.Context, opt GCOptions, rep *GCReport) error {
	if !opt.DryRun {
		if s.probe == nil {
			s.probe = Probe(ctx, s.b)
		}
		if !s.probe.ConditionalDelete {
			return nil
		}
	}
	var names []string
	if err := s.b.List(ctx, "leases/", func(in Info) error {
		names = append(names, strings.TrimPrefix(in.Key, "leases/"))
		return nil
	}); err != nil {
		return err
	}
	for _, n := range names {
		if n == gcLease {
			continue
		}
		li, in, err := s.readLease(ctx, n)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		age := in.Date.Sub(in.Modified)
		if !li.Released && age <= li.TTL() || age < opt.Grace {
			continue
		}
		if !opt.DryRun {
			err := s.b.Delete(ctx, leaseKey(n), in.ETag)
			if errors.Is(err, ErrPrecondition) || errors.Is(err, ErrNotFound) {
				continue // taken over meanwhile
			}
			if err != nil {
				return err
			}
		}
		rep.RemovedLeases++
	}
	return nil
}
