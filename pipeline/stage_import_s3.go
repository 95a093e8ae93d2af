package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/transfer"
)

// An import from a bucket:
//
//	import: { path: s3://models/qwen3/base }
//
// The object base (one file), or the objects under base/ (a directory:
// the outputs are their paths under it, as an import of a local directory
// has them), are fetched into the store by ferry transfer's engine: ranged
// GETs many at once, each with If-Match of the ETag listed, verified
// against the sha256 ferry recorded in an object's metadata or hashed as
// read, resumed from the stage's work directory after a kill. The
// endpoint, region and credentials are read as every S3 tool reads them.
// The record's sources name each object read and its version, as
// "s3://BUCKET/KEY#ETAG" with its size (no local path): a re-run with the
// same objects (ETags and sizes) fetches nothing; where some changed, only
// those are fetched again. copy and follow_links do not apply: objects are
// always copied into the store.

func newS3Import(p *Params, url string) (Stage, error) {
	if p.Has("follow_links") {
		return nil, p.Errorf("follow_links", "does not apply to an import from s3:// (objects are no links)")
	}
	if _, err := p.Bool("copy", false); err != nil {
		return nil, err
	}
	return &importStage{Path: strings.TrimRight(url, "/"), Copy: true}, nil
}

// s3SourceID names an object version in a record's sources.
func s3SourceID(url, etag string) string { return url + "#" + strings.Trim(etag, `"`) }

// s3Rel is an object's output path: its Rel without the source's top
// directory (a single object keeps its name).
func s3Rel(rel string) string {
	if _, rest, ok := strings.Cut(rel, "/"); ok {
		return rest
	}
	return rel
}

// s3ImportInFlight bounds the bytes an import from S3 holds at once
// (fetched, not yet written): the transfer's budget, eight chunks.
const s3ImportInFlight = 8 * transfer.DefaultChunkSize

// planS3 lists the objects (no data read). There is no preview: the
// stages reading the import are planned once it has run.
func (s *importStage) planS3(ctx context.Context) (*StagePlan, error) {
	objs, err := transfer.ListS3(ctx, s.Path)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", s.Path, err)
	}
	var total int64
	for _, o := range objs {
		total += o.Size
	}
	return &StagePlan{Summary: fmt.Sprintf("%d objects, %s, fetched from %s", len(objs), FormatBytes(total), s.Path), Memory: s3ImportInFlight + importMemory}, nil
}

// probeS3 lists the objects (no data read) and compares their versions
// with what rec read.
func (s *importStage) probeS3(rec *manifest.Record) (string, error) {
	objs, err := transfer.ListS3(context.Background(), s.Path)
	if err != nil || rec == nil {
		return "", err
	}
	// A record keyed by content may have read the same bytes elsewhere:
	// only the sources under this URL count.
	mine := map[string]manifest.Stamp{}
	for id, st := range rec.Sources {
		if s.under(id) {
			mine[id] = st
		}
	}
	if len(mine) == 0 {
		return "source path changed: nothing recorded from " + s.Path, nil
	}
	seen := map[string]bool{}
	for _, o := range objs {
		id := s3SourceID(o.URL, o.ETag)
		seen[id] = true
		st, ok := mine[id]
		if !ok || st.Size != o.Size {
			return "source object added or changed: " + s3Rel(o.Rel), nil
		}
	}
	var gone []string
	for id := range mine {
		if !seen[id] {
			gone = append(gone, id)
		}
	}
	if len(gone) > 0 {
		sort.Strings(gone)
		return "source object removed or changed: " + gone[0], nil
	}
	outs := map[string]bool{}
	for _, o := range rec.Outputs {
		outs[o.Path] = true
	}
	for _, o := range objs {
		if !outs[s3Rel(o.Rel)] {
			return "source object added: " + s3Rel(o.Rel), nil
		}
	}
	if len(objs) != len(rec.Outputs) {
		return "source path changed: the record read other objects than " + s.Path, nil
	}
	return "", nil
}

// runS3 fetches the objects into the stage's work directory (a transfer
// to a local directory there, its journal beside it) and adopts each
// verified file as a blob. Objects of the same version as the last
// import, their blobs intact, are not fetched.
func (s *importStage) runS3(ctx context.Context, env *Env) (*Result, error) {
	wd, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	dir, state := filepath.Join(wd, "fetched"), filepath.Join(wd, "state")
	cache := transfer.OpenDigestCache(filepath.Join(state, transfer.DigestCacheFile))
	plan, err := transfer.NewS3Plan(ctx, s.Path, transfer.PlanOptions{Cache: cache})
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", s.Path, err)
	}
	res := &Result{Sources: map[string]manifest.Stamp{}}
	prevOut := map[string]manifest.Output{}
	if env.Prev != nil && !env.Verify {
		for _, o := range env.Prev.Outputs {
			prevOut[o.Path] = o
		}
	}
	byRel := map[string]manifest.Output{}
	var total int64
	fetch := plan.Files[:0:0]
	for _, f := range plan.Files {
		url, etag, _ := f.Object()
		id := s3SourceID(url, etag)
		res.Sources[id] = manifest.Stamp{Size: f.Size}
		total += f.Size
		rel := s3Rel(f.Rel)
		if o, ok := prevOut[rel]; ok && env.Prev.Sources[id].Size == f.Size && o.Size == f.Size &&
			env.Local().CheckBlob(o.Digest, o.Size, false) == "" {
			byRel[rel] = o
			continue
		}
		fetch = append(fetch, f)
	}
	env.Progress.SetTotal(total)
	for _, o := range byRel {
		env.Progress.Add(o.Size)
	}
	if len(fetch) > 0 {
		plan.Files = fetch
		rep, err := transfer.Run(ctx, plan, []transfer.Destination{{Name: s.Path, Dir: dir, Local: true}},
			transfer.Options{StateDir: state, Log: env.Log, InFlight: s3ImportInFlight, Progress: func(string, int64) progress.Reporter { return transferProgress{env.Progress} }})
		cache.StoreObjects(plan)
		if serr := cache.Save(); serr != nil {
			env.Log.Warn("import: the digest cache was not saved", "err", serr)
		}
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", s.Path, err)
		}
		for _, fr := range rep.Hosts[0].Files {
			if !fr.Verified {
				return nil, fmt.Errorf("import %s: %s was not verified", s.Path, fr.Path)
			}
			d, n, err := env.AdoptKnown(filepath.Join(dir, filepath.FromSlash(fr.Path)), fr.Digest, fr.Size)
			if err != nil {
				return nil, fmt.Errorf("import %s: %w", s.Path, err)
			}
			byRel[s3Rel(fr.Path)] = manifest.Output{Path: s3Rel(fr.Path), Digest: d, Size: n}
		}
	}
	rels := make([]string, 0, len(byRel))
	for rel := range byRel {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		res.Outputs = append(res.Outputs, byRel[rel])
	}
	return res, nil
}
