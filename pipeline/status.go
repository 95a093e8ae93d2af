package pipeline

import (
	"fmt"
	"time"

	"github.com/ferry-llm/ferry/manifest"
)

// State is a stage's state in a status report; it marshals as its string.
type State string

// States in a status report.
const (
	StateComplete State = "complete"  // latest record complete, outputs intact by stamp
	StateDamaged  State = "damaged"   // latest record's outputs missing or changed
	StateNeverRun State = "never-run" // no record for this stage
	StateNotBuilt State = "not-built" // the kind is not built yet
)

// StageStatus is one stage's line in a status report.
type StageStatus struct {
	Stage    string            `json:"stage"`
	Kind     string            `json:"kind"`
	State    State             `json:"state"`
	Detail   string            `json:"detail,omitempty"`
	Key      string            `json:"key,omitempty"`
	Finished *time.Time        `json:"finished,omitempty"`
	View     string            `json:"view"`
	Outputs  []manifest.Output `json:"outputs,omitempty"`
}

// StatusReport is the result of Status.
type StatusReport struct {
	Pipeline string             `json:"pipeline"`
	Store    string             `json:"store"`
	Lock     *manifest.LockInfo `json:"lock,omitempty"`
	Stages   []StageStatus      `json:"stages"`
}

// Status reports each stage's latest record, its outputs (sizes, digests)
// and whether they are still intact by stamp. It reads no file data.
func Status(spec *Spec) (*StatusReport, error) {
	store, err := manifest.Load(spec.Store)
	if err != nil {
		return nil, err
	}
	lock, _ := store.ReadLock()
	rep := &StatusReport{Pipeline: spec.Name, Store: spec.Store, Lock: lock}
	for _, st := range spec.Stages {
		ss := StageStatus{Stage: st.Name, Kind: st.Kind, View: spec.ViewDir(st)}
		rec := store.StageRecord(spec.Name, st.Name)
		switch {
		case rec == nil && !Registry[st.Kind].Built():
			ss.State = StateNotBuilt
			ss.Detail = fmt.Sprintf("kind %q is not built yet (comes with %s)", st.Kind, Registry[st.Kind].NotBuilt)
		case rec == nil:
			ss.State = StateNeverRun
		default:
			ss.Key, ss.Outputs = rec.Key, rec.Outputs
			f := rec.Finished
			ss.Finished = &f
			ss.State = StateComplete
			for _, o := range rec.Outputs {
				if why := store.CheckBlob(o.Digest, o.Size, false); why != "" {
					ss.State, ss.Detail = StateDamaged, fmt.Sprintf("output %s %s", o.Path, why)
					break
				}
			}
			if ss.State == StateComplete {
				if why := store.CheckView(ss.View, rec.Outputs); why != "" {
					ss.Detail = "view out of date: " + why
				}
			}
		}
		rep.Stages = append(rep.Stages, ss)
	}
	return rep, nil
}
