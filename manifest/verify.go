package manifest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/store"
)

// Problem is one thing `store verify` found wrong.
type Problem struct {
	Digest Digest `json:"digest,omitempty"`
	Record string `json:"record,omitempty"`
	Stage  string `json:"stage,omitempty"`
	Path   string `json:"path,omitempty"`
	What   string `json:"what"`
}

func (p Problem) String() string {
	s := p.What
	if p.Stage != "" {
		s = fmt.Sprintf("stage %s output %s: %s", p.Stage, p.Path, s)
	}
	if p.Digest != "" {
		s = fmt.Sprintf("blob %s: %s", p.Digest.Short(), s)
	}
	return s
}

// VerifyReport is the result of Verify.
type VerifyReport struct {
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
	// InPlace counts the blobs read in place (links to imported files
	// outside the store), which Blobs and Bytes include when a record
	// refers to them.
	InPlace      int       `json:"in_place_blobs"`
	InPlaceBytes int64     `json:"in_place_bytes"`
	Records      int       `json:"records"`
	Unreferenced int       `json:"unreferenced_blobs"`
	Problems     []Problem `json:"problems"`
}

// OK reports whether nothing is wrong.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// Verify re-hashes every blob and checks every record's outputs against the
// blobs (like `restic check --read-data`). An in-place blob is re-hashed
// through its link (the imported file, only read) when a record refers to
// it; one no record refers to is garbage for GC and is not read. What it
// finds is also written to the manifest (blobs marked damaged, so plan says
// which stages must re-run; good blobs re-stamped); the caller must hold
// the lock. progress, if not nil, is called with the bytes hashed.
func (s *Store) Verify(ctx context.Context, progress func(int64)) (*VerifyReport, error) {
	objs, err := s.objects()
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{Problems: []Problem{}}
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	records := s.Records()
	referenced := map[Digest]bool{}
	for _, r := range records {
		for _, o := range r.Outputs {
			referenced[o.Digest] = true
		}
	}
	// The in-place blobs are this machine's: links to imported files,
	// which the store's listing does not hold. An entry that is neither a
	// file nor such a link is a stray (a misnamed file the store reports).
	links := map[Digest]string{}
	strayDirs := map[string]bool{}
	for _, e := range entries {
		d, derr := digest.FromHex(e.Name())
		switch {
		case derr == nil && e.Type()&fs.ModeSymlink != 0:
			links[d], _ = os.Readlink(s.BlobPath(d))
		case !e.Type().IsRegular():
			strayDirs[e.Name()] = e.IsDir()
			rep.Problems = append(rep.Problems, Problem{Path: filepath.Join(dir, e.Name()), What: "stray entry in the blob directory"})
		}
	}
	var progMu sync.Mutex
	prog := func(n int64) {
		if progress != nil {
			progMu.Lock()
			progress(n)
			progMu.Unlock()
		}
	}
	parallel := max(1, min(runtime.NumCPU(), 8))

	// The store's part, as on every store: its blobs re-hashed, its
	// records' outputs and the imports' (this machine's records, never
	// objects) checked against them.
	var also []*store.Record
	for _, r := range records {
		if IsObject(r) {
			continue
		}
		sr := &store.Record{Key: r.Key}
		for _, o := range r.Outputs {
			if _, ok := links[o.Digest]; !ok {
				sr.Outputs = append(sr.Outputs, store.Output{Path: o.Path, Digest: o.Digest, Size: o.Size})
			}
		}
		also = append(also, sr)
	}
	present := map[Digest]bool{}
	got := map[Digest]Digest{}
	srep, err := objs.VerifyWith(ctx, store.VerifyOptions{Progress: prog, Parallel: parallel, Also: also,
		Blob: func(d, g Digest, _ int64) { present[d], got[d] = true, g }})
	if err != nil {
		return nil, err
	}
	rep.Blobs, rep.Bytes, rep.Records, rep.Unreferenced = srep.Blobs, srep.Bytes, srep.Records, srep.Unreferenced
	damaged := map[string]string{}
	// A blob whose bytes do not hash to its name is damaged whatever its
	// size: each record naming it says "blob damaged" (below), not that
	// its size is wrong.
	for _, p := range srep.Problems {
		if errors.Is(p.Err, store.ErrDigestMismatch) {
			damaged[p.Blob.Hex()] = "content does not match its digest"
			rep.Problems = append(rep.Problems, Problem{Digest: p.Blob, What: "content does not match its digest (hashes to " + got[p.Blob].Short() + ")"})
		}
	}
	for _, p := range srep.Problems {
		stage := ""
		if r := s.Record(p.Record); r != nil {
			stage = r.Stage
		}
		switch {
		case errors.Is(p.Err, store.ErrDigestMismatch):
		case p.Key != "":
			// A file under blobs/ not named by a digest: a stray, once
			// (one inside a stray directory is that directory's).
			rel, _ := strings.CutPrefix(p.Key, "blobs/"+Algorithm+"/")
			if first, _, _ := strings.Cut(rel, "/"); rel != p.Key && strayDirs[first] {
				continue
			}
			rep.Problems = append(rep.Problems, Problem{Path: filepath.Join(s.Root, filepath.FromSlash(p.Key)), What: "stray entry in the blob directory"})
		case errors.Is(p.Err, store.ErrSizeMismatch) && damaged[p.Blob.Hex()] != "":
			// damaged: said below
		case errors.Is(p.Err, store.ErrBlobMissing):
			if _, ok := links[p.Blob]; ok {
				continue // in place: checked below
			}
			damaged[p.Blob.Hex()] = "missing"
			rep.Problems = append(rep.Problems, Problem{Digest: p.Blob, Record: p.Record, Stage: stage, Path: p.Output, What: "blob missing"})
		case errors.Is(p.Err, store.ErrSizeMismatch):
			damaged[p.Blob.Hex()] = "size differs from record"
			rep.Problems = append(rep.Problems, Problem{Digest: p.Blob, Record: p.Record, Stage: stage, Path: p.Output,
				What: strings.TrimPrefix(p.What, "output "+p.Output+": ")})
		case p.Ref != "":
			rep.Problems = append(rep.Problems, Problem{What: p.String()})
		default: // an unreadable record, a misnamed file under blobs/
			rep.Problems = append(rep.Problems, Problem{Digest: p.Blob, Record: p.Record, Stage: stage, What: p.What})
		}
	}
	for d, g := range got {
		if g != d {
			continue
		}
		// Re-stamped as hashed (the stamp is what later runs trust).
		fi, err := os.Stat(s.BlobPath(d))
		if err != nil {
			return nil, err
		}
		s.setStamp(d, StampOf(fi))
	}

	// This machine's part: the in-place blobs a record names, re-hashed
	// through their links (the imported files, only read); one no record
	// names is garbage for gc and is not read.
	type hashed struct {
		d   Digest
		got Digest
		n   int64
		st  Stamp
		err error // the imported file could not be read
	}
	var res []*hashed
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for d := range links {
		present[d] = true
		rep.InPlace++
		if !referenced[d] {
			rep.Unreferenced++
			continue
		}
		h := &hashed{d: d}
		res = append(res, h)
		g.Go(func() error {
			sum, n, err := hashFileProgress(gctx, s.BlobPath(d), prog)
			if err != nil && gctx.Err() == nil {
				h.err = err
				return nil
			}
			if err != nil {
				return err
			}
			fi, err := os.Stat(s.BlobPath(d))
			if err != nil {
				h.err = err
				return nil
			}
			h.got, h.n, h.st = sum, n, StampOf(fi)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, h := range res {
		where := " (read in place from " + links[h.d] + ")"
		rep.Blobs++
		rep.Bytes += h.n
		rep.InPlaceBytes += h.n
		switch {
		case h.err != nil:
			damaged[h.d.Hex()] = "missing" + where
			rep.Problems = append(rep.Problems, Problem{Digest: h.d, What: fmt.Sprintf("in-place file cannot be read: %v", h.err)})
			continue
		case h.got != h.d:
			damaged[h.d.Hex()] = "content does not match its digest" + where
			rep.Problems = append(rep.Problems, Problem{Digest: h.d, What: "content does not match its digest (hashes to " + h.got.Short() + ")" + where})
			continue
		}
		s.setStamp(h.d, h.st)
	}
	// Every record naming a damaged blob says so; an in-place output's
	// size is checked against its stamp.
	for _, r := range records {
		for _, o := range r.Outputs {
			why := damaged[o.Digest.Hex()]
			switch _, inPlace := links[o.Digest]; {
			case why != "" && why != "missing" && why != "size differs from record":
				rep.Problems = append(rep.Problems, Problem{Digest: o.Digest, Record: r.Key, Stage: r.Stage, Path: o.Path, What: "blob damaged"})
			case inPlace && why == "":
				if st, _ := s.stamp(o.Digest); st.Size != o.Size {
					damaged[o.Digest.Hex()] = "size differs from record"
					rep.Problems = append(rep.Problems, Problem{Digest: o.Digest, Record: r.Key, Stage: r.Stage, Path: o.Path,
						What: fmt.Sprintf("blob is %d bytes, record says %d", st.Size, o.Size)})
				}
			}
		}
	}
	s.mu.Lock()
	s.m.Damaged = damaged
	for h := range s.m.Blobs {
		if d, err := digest.FromHex(h); err != nil || !present[d] {
			delete(s.m.Blobs, h)
		}
	}
	s.mu.Unlock()
	sort.SliceStable(rep.Problems, func(i, j int) bool { return rep.Problems[i].Digest < rep.Problems[j].Digest })
	if err := s.Save(); err != nil {
		return nil, err
	}
	return rep, nil
}

func hashFileProgress(ctx context.Context, p string, progress func(int64)) (Digest, int64, error) {
	d, n, err := hashing.File(ctx, p, progress)
	if err != nil {
		return "", 0, err
	}
	return NewDigest(d[:]), n, nil
}

// GCReport is the result of GC.
type GCReport struct {
	PrunedRecords int   `json:"pruned_records"`
	RemovedBlobs  int   `json:"removed_blobs"`
	RemovedBytes  int64 `json:"removed_bytes"`
	// RemovedInPlace counts the removed blobs that were links to imported
	// files (the files stay; RemovedBytes does not count them).
	RemovedInPlace int `json:"removed_in_place"`
	RemovedTemp    int `json:"removed_temp"`
	KeptBlobs      int `json:"kept_blobs"`
	// AbortedUploads: multipart uploads into the store (store copy's)
	// left unfinished longer ago than store.DefaultGCGrace.
	AbortedUploads int `json:"aborted_uploads"`
}

// GC removes blobs no record refers to (store.GC on this directory, with
// the imports' blobs kept and no grace period: the lock keeps every
// writer out), unfinished uploads into the store older than
// store.DefaultGCGrace, in-place links no record names and leftover ingest
// temp files, and (with journals) the resume state of unfinished stage
// runs: their journals and work directories. The caller must hold the
// lock.
func (s *Store) GC(journals bool) (*GCReport, error) {
	return s.gc(journals, false)
}

// GCPrune is GC after dropping every record that no pipeline stage points
// at any more (results of old parameters or inputs, kept by default so
// switching back is a cache hit).
func (s *Store) GCPrune(journals bool) (*GCReport, error) {
	return s.gc(journals, true)
}

func (s *Store) gc(journals, prune bool) (*GCReport, error) {
	objs, err := s.objects()
	if err != nil {
		return nil, err
	}
	rep := &GCReport{}
	if prune {
		s.mu.Lock()
		live := map[string]bool{}
		for _, stages := range s.m.Pipelines {
			for _, k := range stages {
				live[k] = true
			}
		}
		var objs []string
		for k, r := range s.m.Records {
			if !live[k] {
				if IsObject(r) {
					objs = append(objs, k)
				}
				delete(s.m.Records, k)
				rep.PrunedRecords++
			}
		}
		s.mu.Unlock()
		if err := s.dropObjects(objs); err != nil {
			return nil, err
		}
		// The manifest without those records is saved before any blob
		// goes: a crash in between leaves garbage, never a dangling record.
		if err := s.Save(); err != nil {
			return nil, err
		}
	}
	// The store's part, as on every store: the blobs no record names go
	// (those only the imports name, this machine's records and never
	// objects, are kept with the rest), and uploads a killed copy left
	// longer ago than the grace period.
	var keep []Digest
	referenced := map[Digest]bool{}
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			keep = append(keep, o.Digest)
			referenced[o.Digest] = true
		}
	}
	srep, err := objs.GC(context.Background(), store.GCOptions{Exclusive: true, Keep: keep,
		Removed: func(d Digest, _ store.Info) {
			s.mu.Lock()
			delete(s.m.Blobs, d.Hex())
			delete(s.m.Damaged, d.Hex())
			s.mu.Unlock()
		}})
	if err != nil {
		return nil, err
	}
	rep.RemovedBlobs, rep.RemovedBytes, rep.KeptBlobs, rep.AbortedUploads = srep.RemovedBlobs, srep.RemovedBytes, srep.KeptBlobs, srep.AbortedUploads
	rep.RemovedTemp += srep.RemovedTemp
	rep.RemovedBytes += srep.RemovedTempBytes
	// This machine's part: the in-place blobs (links to imported files)
	// no record names. Removing one removes the link, never the imported
	// file, and frees nothing.
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		d, derr := digest.FromHex(e.Name())
		link, regular := e.Type()&fs.ModeSymlink != 0, e.Type().IsRegular()
		switch {
		case derr == nil && regular:
			continue // a blob: the store's
		case derr == nil && link && referenced[d]:
			rep.KeptBlobs++
			continue
		case !link && !regular:
			continue // a directory or a device: verify reports it
		}
		// An unreferenced link, or a file or link not named by a digest
		// (a stray: no record can name it).
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
		rep.RemovedBlobs++
		if regular {
			rep.RemovedBytes += fi.Size()
			continue
		}
		rep.RemovedInPlace++
		s.mu.Lock()
		delete(s.m.Blobs, e.Name())
		delete(s.m.Damaged, e.Name())
		s.mu.Unlock()
	}
	if err := fsyncDirIfExists(dir); err != nil {
		return nil, err
	}
	// The journals and the stage work dirs of unfinished runs are what a
	// resumed run continues from: only --journals drops them.
	sub := []string{"tmp"}
	if journals {
		sub = append(sub, "ingest", "work")
	}
	for _, d := range sub {
		n, err := clearDir(filepath.Join(s.Root, d))
		if err != nil {
			return nil, err
		}
		rep.RemovedTemp += n
	}
	if err := s.Save(); err != nil {
		return nil, err
	}
	return rep, nil
}

// ClearTemp removes leftover ingest temp files; the runner calls it once it
// holds the lock (no other writer can be using them).
func (s *Store) ClearTemp() error {
	_, err := clearDir(filepath.Join(s.Root, "tmp"))
	return err
}

func clearDir(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return 0, err
		}
	}
	return len(entries), nil
}

func fsyncDirIfExists(dir string) error {
	if _, err := os.Stat(dir); err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	return fsutil.SyncDir(dir)
}

// DropRecords removes the records keys that no pipeline stage points at
// (a key a stage points at is kept) and saves the manifest; their blobs
// stay until GC removes those no record names. It returns how many went.
// The caller must hold the lock.
func (s *Store) DropRecords(keys []string) (int, error) {
	s.mu.Lock()
	live := map[string]bool{}
	for _, stages := range s.m.Pipelines {
		for _, k := range stages {
			live[k] = true
		}
	}
	n := 0
	var objs []string
	for _, k := range keys {
		if r, ok := s.m.Records[k]; ok && !live[k] {
			if IsObject(r) {
				objs = append(objs, k)
			}
			delete(s.m.Records, k)
			n++
		}
	}
	s.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	if err := s.dropObjects(objs); err != nil {
		return 0, err
	}
	return n, s.Save()
}

// Unpointed returns the keys of the records no pipeline stage points at.
func (s *Store) Unpointed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[string]bool{}
	for _, stages := range s.m.Pipelines {
		for _, k := range stages {
			live[k] = true
		}
	}
	var keys []string
	for k := range s.m.Records {
		if !live[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
