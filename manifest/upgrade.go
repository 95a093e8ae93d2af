package manifest

import (
	"fmt"
	"sort"
)

// upgradeV1 converts a format-1 manifest (written by releases up to 0.1:
// record keys that held ferry's version, params hashed in struct order,
// imports keyed by their absolute path) to the current format, in memory,
// without re-running anything: every record gets the key the current
// scheme gives it (StageKey of its kind, kind version, canonical params and
// inputs' digests; a record with Sources, an import, SourceKey of what it
// imported), downstream records' Inputs[].Key and the pipelines map follow.
// An attempt's key stays: it names the journals and work dir of a run that
// did not finish, and attempts do not hold the params a key needs (that
// stage starts again under its new key).
//
// Two records that the old keys told apart only by ferry's version get one
// key: the one a pipeline points at stays, else the later one.
func upgradeV1(m *Manifest) error {
	pointed := map[string]bool{}
	for _, stages := range m.Pipelines {
		for _, k := range stages {
			pointed[k] = true
		}
	}
	old := make([]string, 0, len(m.Records))
	for k := range m.Records {
		old = append(old, k)
	}
	sort.Strings(old)             // deterministic when two records tie
	rekey := map[string]string{}  // old key → new
	chosen := map[string]string{} // new key → the old key of the record it holds
	records := make(map[string]*Record, len(m.Records))
	for _, ok := range old {
		r := m.Records[ok]
		nk, params, err := recordKey(r)
		if err != nil {
			return fmt.Errorf("record %s (%s/%s): %w", ok, r.Pipeline, r.Stage, err)
		}
		rekey[ok] = nk
		if prev, dup := chosen[nk]; dup && !preferV1(r, ok, m.Records[prev], prev, pointed) {
			continue
		}
		chosen[nk] = ok
		c := *r
		c.Key, c.Params = nk, params
		c.Inputs = append([]Input(nil), r.Inputs...)
		records[nk] = &c
	}
	for _, r := range records {
		for i, in := range r.Inputs {
			if nk, ok := rekey[in.Key]; ok {
				r.Inputs[i].Key = nk
			}
		}
	}
	for _, stages := range m.Pipelines {
		for st, k := range stages {
			if nk, ok := rekey[k]; ok {
				stages[st] = nk
			}
		}
	}
	m.Records, m.Version = records, 2
	return nil
}

// preferV1 says whether record r (old key k) should replace record o (old
// key ok) for the new key both get.
func preferV1(r *Record, k string, o *Record, ok string, pointed map[string]bool) bool {
	if pointed[k] != pointed[ok] {
		return pointed[k]
	}
	return r.Finished.After(o.Finished)
}

// recordKey is the key and the params record r has under the current key
// scheme.
func recordKey(r *Record) (string, []byte, error) {
	if len(r.Sources) > 0 {
		params, err := SourceParams(r.Params)
		if err != nil {
			return "", nil, err
		}
		k, err := SourceKey(r.Kind, r.KindVersion, params, r.OutputsDigest())
		return k, params, err
	}
	params, err := CanonicalJSON(r.Params)
	if err != nil {
		return "", nil, err
	}
	ins := make([]Digest, len(r.Inputs))
	for i, in := range r.Inputs {
		ins[i] = in.Digest
	}
	k, err := StageKey(r.Kind, r.KindVersion, params, ins)
	return k, params, err
}
