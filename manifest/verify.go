package manifest

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
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
	rep := &VerifyReport{Problems: []Problem{}}
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	referenced := map[string]bool{}
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			referenced[o.Digest.Hex()] = true
		}
	}
	present := map[string]bool{}
	damaged := map[string]string{}
	// Hash the blobs on a bounded pool; results are reported in name order.
	type hashed struct {
		d       Digest
		got     Digest
		n       int64
		st      Stamp
		err     error // an in-place blob's file could not be read
		skip    bool  // a stray entry
		inPlace string
		unread  bool // an in-place blob no record refers to
	}
	res := make([]hashed, len(entries))
	var progMu sync.Mutex
	prog := func(n int64) {
		if progress != nil {
			progMu.Lock()
			progress(n)
			progMu.Unlock()
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, min(runtime.NumCPU(), 8)))
	for i, e := range entries {
		d, derr := digest.FromHex(e.Name())
		link := e.Type()&fs.ModeSymlink != 0
		if derr != nil || !(e.Type().IsRegular() || link) {
			res[i].skip = true
			continue
		}
		res[i].d = d
		if link {
			res[i].inPlace, _ = os.Readlink(s.BlobPath(d))
			if !referenced[d.Hex()] {
				res[i].unread = true
				continue
			}
		}
		g.Go(func() error {
			got, n, err := hashFileProgress(gctx, s.BlobPath(d), prog)
			if err != nil && link && gctx.Err() == nil {
				res[i].err = err
				return nil
			}
			if err != nil {
				return err
			}
			fi, err := os.Stat(s.BlobPath(d))
			if err != nil {
				return err
			}
			res[i].got, res[i].n, res[i].st = got, n, StampOf(fi)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i, e := range entries {
		r := res[i]
		if r.skip {
			rep.Problems = append(rep.Problems, Problem{Path: filepath.Join(dir, e.Name()), What: "stray entry in the blob directory"})
			continue
		}
		present[r.d.Hex()] = true
		if r.inPlace != "" {
			rep.InPlace++
		}
		if r.unread {
			continue
		}
		rep.Blobs++
		rep.Bytes += r.n
		where := ""
		if r.inPlace != "" {
			rep.InPlaceBytes += r.n
			where = " (read in place from " + r.inPlace + ")"
		}
		switch {
		case r.err != nil:
			damaged[r.d.Hex()] = "missing" + where
			rep.Problems = append(rep.Problems, Problem{Digest: r.d, What: fmt.Sprintf("in-place file cannot be read: %v", r.err)})
			continue
		case r.got != r.d:
			damaged[r.d.Hex()] = "content does not match its digest" + where
			rep.Problems = append(rep.Problems, Problem{Digest: r.d, What: "content does not match its digest (hashes to " + r.got.Short() + ")" + where})
			continue
		}
		s.setStamp(r.d, r.st)
	}
	for _, r := range s.Records() {
		rep.Records++
		for _, o := range r.Outputs {
			switch {
			case !present[o.Digest.Hex()]:
				damaged[o.Digest.Hex()] = "missing"
				rep.Problems = append(rep.Problems, Problem{Digest: o.Digest, Record: r.Key, Stage: r.Stage, Path: o.Path, What: "blob missing"})
			case damaged[o.Digest.Hex()] != "":
				rep.Problems = append(rep.Problems, Problem{Digest: o.Digest, Record: r.Key, Stage: r.Stage, Path: o.Path, What: "blob damaged"})
			default:
				st, _ := s.stamp(o.Digest)
				if st.Size != o.Size {
					damaged[o.Digest.Hex()] = "size differs from record"
					rep.Problems = append(rep.Problems, Problem{Digest: o.Digest, Record: r.Key, Stage: r.Stage, Path: o.Path,
						What: fmt.Sprintf("blob is %d bytes, record says %d", st.Size, o.Size)})
				}
			}
		}
	}
	for h := range present {
		if !referenced[h] {
			rep.Unreferenced++
		}
	}
	s.mu.Lock()
	s.m.Damaged = damaged
	for h := range s.m.Blobs {
		if !present[h] {
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
}

// GC removes blobs no record refers to and leftover ingest temp files, and
// (with journals) the resume state of unfinished stage runs: their journals
// and work directories. The caller must hold the lock.
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
	referenced := map[string]bool{}
	for _, r := range s.Records() {
		for _, o := range r.Outputs {
			referenced[o.Digest.Hex()] = true
		}
	}
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if referenced[e.Name()] {
			rep.KeptBlobs++
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		// An in-place blob is a link: removing it removes the link, never
		// the imported file, and frees nothing.
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return nil, err
		}
		rep.RemovedBlobs++
		if fi.Mode().IsRegular() {
			rep.RemovedBytes += fi.Size()
		} else {
			rep.RemovedInPlace++
		}
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
