package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// CopyReport is what Copy did.
type CopyReport struct {
	From          string   `json:"from"`
	To            string   `json:"to"`
	Records       int      `json:"records"`        // copied
	RecordsThere  int      `json:"records_there"`  // already in the destination
	Blobs         int      `json:"blobs"`          // copied
	Bytes         int64    `json:"bytes"`          // copied
	BlobsThere    int      `json:"blobs_there"`    // already in the destination
	Refs          int      `json:"refs"`           // copied
	RefsThere     int      `json:"refs_there"`     // already the same there
	RefsConflicts []string `json:"refs_conflicts"` // set otherwise there: kept
}

// Copy copies every record of src, with the blobs it names, and every ref
// into dst. A blob goes through a file in dst's cache directory: fetched
// from src verified (ranged, resumable), then stored in dst (its SHA-256
// checked by the storage, multipart resumable). What dst already has is
// skipped, so a Copy run again after a kill continues; a record is
// written only after its blobs. A ref dst holds with another value is
// kept and reported. progress is told of bytes copied.
func Copy(ctx context.Context, src, dst *Store, progress func(int64)) (*CopyReport, error) {
	if progress == nil {
		progress = func(int64) {}
	}
	rep := &CopyReport{From: src.String(), To: dst.String(), RefsConflicts: []string{}}
	var keys []string
	if err := src.Records(ctx, func(k string) error { keys = append(keys, k); return nil }); err != nil {
		return nil, err
	}
	tmpDir := filepath.Join(dst.opt.CacheDir, "copy")
	if err := os.MkdirAll(tmpDir, 0o755); err != nil {
		return nil, err
	}
	done := map[string]bool{}
	for _, k := range keys {
		r, err := src.Record(ctx, k)
		if err != nil {
			return nil, err
		}
		if _, err := dst.Record(ctx, k); err == nil {
			rep.RecordsThere++
			continue
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		for _, o := range r.Outputs {
			if done[string(o.Digest)] {
				continue
			}
			size, ok, err := dst.HasBlob(ctx, o.Digest)
			if err != nil {
				return nil, err
			}
			if ok && size == o.Size {
				rep.BlobsThere++
				done[string(o.Digest)] = true
				continue
			}
			tmp := filepath.Join(tmpDir, o.Digest.Hex())
			if err := src.FetchBlob(ctx, o.Digest, tmp, nil); err != nil {
				return nil, fmt.Errorf("copy record %s, output %s: %w", k, o.Path, err)
			}
			if err := dst.PutFile(ctx, o.Digest, tmp, progress); err != nil {
				return nil, fmt.Errorf("copy record %s, output %s: %w", k, o.Path, err)
			}
			os.Remove(tmp)
			rep.Blobs++
			rep.Bytes += o.Size
			done[string(o.Digest)] = true
		}
		// The record as it stands in src, whoever made it.
		if _, err := dst.CommitRecord(ctx, r); err != nil {
			if !errors.Is(err, ErrRecordExists) {
				return nil, err
			}
			rep.RecordsThere++
			continue
		}
		rep.Records++
	}
	var refs []string
	if err := src.b.List(ctx, "refs/", func(in Info) error {
		refs = append(refs, strings.TrimPrefix(in.Key, "refs/"))
		return nil
	}); err != nil {
		return nil, err
	}
	sort.Strings(refs)
	for _, name := range refs {
		r, err := src.GetRef(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		have, err := dst.GetRef(ctx, name)
		switch {
		case err == nil && have.Value == r.Value:
			rep.RefsThere++
			continue
		case err == nil:
			rep.RefsConflicts = append(rep.RefsConflicts, fmt.Sprintf("%s: %s here, %s there (kept)", name, r.Value, have.Value))
			continue
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
		if _, err := dst.SetRef(ctx, name, r.Value, nil); err != nil {
			if errors.Is(err, ErrRefConflict) {
				rep.RefsConflicts = append(rep.RefsConflicts, name+": set there meanwhile (kept)")
				continue
			}
			return nil, err
		}
		rep.Refs++
	}
	return rep, nil
}
