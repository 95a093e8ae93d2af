package manifest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/store"
)

// StageUsage is what one record's outputs take.
type StageUsage struct {
	Pipeline string `json:"pipeline,omitempty"`
	Stage    string `json:"stage"`
	Key      string `json:"key"`
	// Live: a pipeline stage points at the record (gc --prune-records
	// keeps it; the others are results of old parameters or inputs).
	Live    bool `json:"live"`
	Outputs int  `json:"outputs"`
	// BlobBytes are outputs held as files in the store (a clone made by an
	// import counts in full, though it shares its blocks with the imported
	// file); InPlaceBytes are
	// outputs read in place from files outside it (imports); MissingBytes
	// are outputs whose blob or in-place file is gone.
	BlobBytes    int64 `json:"blob_bytes"`
	InPlaceBytes int64 `json:"in_place_bytes"`
	MissingBytes int64 `json:"missing_bytes,omitempty"`
	// SharedBytes is the part of BlobBytes that other records hold too (the
	// same content, stored once).
	SharedBytes int64 `json:"shared_bytes"`
}

// FreeUsage is what a gc would remove.
type FreeUsage struct {
	Records int   `json:"records,omitempty"`
	Blobs   int   `json:"blobs"`
	Bytes   int64 `json:"bytes"`
}

// DiskUsage is the result of Store.DiskUsage.
type DiskUsage struct {
	Store  string       `json:"store"`
	Stages []StageUsage `json:"stages"`
	// BlobBytes counts every file under blobs/ once; InPlaceBytes every
	// file read in place once.
	BlobBytes    int64 `json:"blob_bytes"`
	InPlaceBytes int64 `json:"in_place_bytes"`
	// ResumeBytes is the resume state of unfinished stage runs (journals,
	// work dirs), which gc --journals removes; TempBytes leftover temp
	// files, which every gc removes.
	ResumeBytes int64 `json:"resume_bytes"`
	TempBytes   int64 `json:"temp_bytes"`
	// GC is what `store gc` would free; GCPrune what `store gc
	// --prune-records` would (GC included). In-place files are never
	// freed: gc removes only links to them.
	GC      FreeUsage `json:"gc"`
	GCPrune FreeUsage `json:"gc_prune_records"`
}

// DiskUsage says what each record's outputs take in the store and in place,
// and what gc would free. It reads no file data.
func (s *Store) DiskUsage() (*DiskUsage, error) {
	du := &DiskUsage{Store: s.Root, Stages: []StageUsage{}}
	type blob struct {
		size    int64
		inPlace bool
		missing bool
	}
	blobs := map[string]blob{} // present under blobs/, by hex
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if _, err := digest.FromHex(e.Name()); err != nil {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var b blob
		if e.Type()&fs.ModeSymlink != 0 {
			b.inPlace = true
		}
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			b.missing = true
		case !fi.Mode().IsRegular():
			continue
		default:
			b.size = fi.Size()
		}
		blobs[e.Name()] = b
		if b.inPlace {
			du.InPlaceBytes += b.size
		} else {
			du.BlobBytes += b.size
		}
	}
	s.mu.Lock()
	live := map[string]bool{}
	for _, stages := range s.m.Pipelines {
		for _, k := range stages {
			live[k] = true
		}
	}
	s.mu.Unlock()
	recs := s.Records()
	holders := map[string]int{}     // hex → records referring to it
	liveHolders := map[string]int{} // hex → live records referring to it
	for _, r := range recs {
		seen := map[string]bool{}
		for _, o := range r.Outputs {
			h := o.Digest.Hex()
			if seen[h] {
				continue
			}
			seen[h] = true
			holders[h]++
			if live[r.Key] {
				liveHolders[h]++
			}
		}
	}
	for _, r := range recs {
		u := StageUsage{Pipeline: r.Pipeline, Stage: r.Stage, Key: r.Key, Live: live[r.Key], Outputs: len(r.Outputs)}
		for _, o := range r.Outputs {
			b, ok := blobs[o.Digest.Hex()]
			switch {
			case !ok || b.missing:
				u.MissingBytes += o.Size
			case b.inPlace:
				u.InPlaceBytes += o.Size
			default:
				u.BlobBytes += o.Size
				if holders[o.Digest.Hex()] > 1 {
					u.SharedBytes += o.Size
				}
			}
		}
		du.Stages = append(du.Stages, u)
	}
	sort.SliceStable(du.Stages, func(i, j int) bool {
		a, b := du.Stages[i], du.Stages[j]
		if a.Live != b.Live {
			return a.Live
		}
		if a.Pipeline != b.Pipeline {
			return a.Pipeline < b.Pipeline
		}
		return a.Stage < b.Stage
	})
	for h, b := range blobs {
		free := func(f *FreeUsage) {
			f.Blobs++
			if !b.inPlace {
				f.Bytes += b.size
			}
		}
		if holders[h] == 0 {
			free(&du.GC)
			free(&du.GCPrune)
		} else if liveHolders[h] == 0 {
			free(&du.GCPrune)
		}
	}
	for _, r := range recs {
		if !live[r.Key] {
			du.GCPrune.Records++
		}
	}
	if du.TempBytes, err = treeBytes(filepath.Join(s.Root, "tmp")); err != nil {
		return nil, err
	}
	du.GC.Bytes += du.TempBytes
	du.GCPrune.Bytes += du.TempBytes
	if objs := s.Objects(); objs != nil {
		// The store's own temp files (a copy into this directory cut
		// short): gc removes those past its grace period.
		tr, err := objs.Temp(context.Background(), store.DefaultGCGrace, false)
		if err != nil {
			return nil, err
		}
		du.TempBytes += tr.Bytes
		du.GC.Bytes += tr.RemovedBytes
		du.GCPrune.Bytes += tr.RemovedBytes
	}
	for _, d := range []string{"ingest", "work"} {
		n, err := treeBytes(filepath.Join(s.Root, d))
		if err != nil {
			return nil, err
		}
		du.ResumeBytes += n
	}
	return du, nil
}

// treeBytes sums the sizes of the regular files under dir (links are not
// followed).
func treeBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if de.Type().IsRegular() {
			fi, err := de.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
