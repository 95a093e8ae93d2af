package pipeline

import (
	"encoding/json"
	"fmt"

	"github.com/ferry-llm/ferry/manifest"
)

// A stage that reads files outside the store (a Prober: import) is keyed by
// what it read, not where: its record's key is manifest.SourceKey of its
// params without the path and its outputs' digest, known only once it has
// run. So two imports of the same files from two directories, or two
// machines, share a record, and moving a model directory changes no key
// downstream. Before it runs, it is decided from records and stamps: the
// stage's latest record, or any record of the same kind and params whose
// sources (on this machine) are the files it would read, unchanged by
// stamp. Its journals, work dir and attempt go under a work key of its
// params with the path (runner.key), a fact of this machine only.

// decideSourced is decide for a source-keyed stage st whose work key and
// canonical params (with the path) are work and params.
func (r *runner) decideSourced(st *StageSpec, p Prober, work string, params json.RawMessage, forced, outputs bool) (decision, error) {
	keyParams, err := manifest.SourceParams(params)
	if err != nil {
		return decision{}, err
	}
	d := decision{action: ActionRun, work: work, params: keyParams}
	if forced {
		d.reason, d.cause = "forced", CauseForced
		return d, nil
	}
	version := r.spec.KindOf(st).Version
	same := func(rec *manifest.Record) bool {
		return rec.Kind == st.Kind && rec.KindVersion == version && jsonEqual(rec.Params, keyParams)
	}
	prev := r.store.StageRecord(r.spec.Name, st.Name)
	switch {
	case prev == nil || !same(prev):
		d.cause, d.reason = r.whyNoRecord(st, keyParams, nil)
		// Say now if the run is bound to fail (a source that is not there).
		if why, err := p.Probe(nil); err != nil {
			d.reason += " (" + err.Error() + ")"
		} else if why != "" {
			d.reason += " (" + why + ")"
		}
	default:
		// Sources first: an import reading its files in place sees a
		// changed file as a changed source (only that file is hashed
		// again), not as a damaged output.
		why, err := p.Probe(prev)
		if err != nil {
			return decision{}, err
		}
		if why == "" {
			for _, o := range prev.Outputs {
				if !outputs {
					break
				}
				if why := r.checkOutput(st, o); why != "" {
					// Run to repair it, not to take another record.
					d.reason, d.cause = fmt.Sprintf("output %s %s", o.Path, why), CauseOutput
					return r.withResumable(d), nil
				}
			}
			d.action, d.reason, d.cause, d.key, d.rec = ActionSkip, "up to date", "", prev.Key, prev
			return d, nil
		}
		d.reason, d.cause = why, CauseSource
	}
	// The same files, read by another stage or pipeline (or before this
	// stage was renamed, or its path changed back), need not be read again
	// (by stamp: --verify reads them).
	for _, rec := range r.store.Records() {
		if r.opts.Verify {
			break
		}
		if (prev != nil && rec.Key == prev.Key) || len(rec.Sources) == 0 || !same(rec) {
			continue
		}
		// A record of files elsewhere is passed over without a listing.
		if rf, ok := p.(interface{ readsFrom(*manifest.Record) bool }); ok && !rf.readsFrom(rec) {
			continue
		}
		if why, err := p.Probe(rec); err != nil || why != "" {
			continue
		}
		intact := true
		for _, o := range rec.Outputs {
			if r.store.CheckBlob(o.Digest, o.Size, false) != "" {
				intact = false
				break
			}
		}
		if intact {
			d.action, d.cause, d.key, d.rec = ActionSkip, "", rec.Key, rec
			d.reason = fmt.Sprintf("up to date (the same files as %s/%s)", rec.Pipeline, rec.Stage)
			return d, nil
		}
	}
	return r.withResumable(d), nil
}

// withResumable adds to d's reason what a killed run left to resume.
func (r *runner) withResumable(d decision) decision {
	if n := r.store.Resumable(d.work); n > 0 {
		d.reason += "; " + ResumableDetail(n)
	}
	return d
}
