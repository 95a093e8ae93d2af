package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/store"
)

// State is a stage's state in a status report; it marshals as its string.
type State string

// States in a status report.
const (
	StateComplete State = "complete"  // latest record complete, outputs intact by stamp
	StateDamaged  State = "damaged"   // latest record's outputs missing or changed
	StateNeverRun State = "never-run" // no record for this stage
	StateNotBuilt State = "not-built" // the kind is not built yet
	StatePartial  State = "partial"   // a run started and did not finish (killed, or running now)
	StateFailed   State = "failed"    // the latest run failed (Error says why)
	// The latest run was interrupted (Ctrl-C, SIGTERM) while the stage ran;
	// Detail says what it left to resume.
	StateInterrupted State = "interrupted"
)

// StageStatus is one stage's line in a status report.
type StageStatus struct {
	Stage    string     `json:"stage"`
	Kind     string     `json:"kind"`
	State    State      `json:"state"`
	Detail   string     `json:"detail,omitempty"`
	Key      string     `json:"key,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
	// Seconds is how long the recorded run took; Bytes the outputs' total.
	Seconds float64           `json:"seconds,omitempty"`
	Bytes   int64             `json:"bytes,omitempty"`
	View    string            `json:"view"`
	Outputs []manifest.Output `json:"outputs,omitempty"`
	// Error is why the latest run failed (state failed).
	Error string `json:"error,omitempty"`
	// Resumable is what an unfinished or failed run left for the next
	// one to continue from (journals, work dir), in bytes.
	Resumable int64 `json:"resumable_bytes,omitempty"`
	// Remote is, for a transfer, what its record says of each
	// destination: where each file is and whether it was verified there.
	Remote []RemoteStatus `json:"remote,omitempty"`
	// Shared is what the shared store holds of the stage (SharedStatus);
	// nil when it has nothing of it.
	Shared *SharedStage `json:"shared,omitempty"`
}

// SharedStage is what a shared store holds of a stage: the record its
// ref names (the latest made of it, on any machine), and a machine
// making it now.
type SharedStage struct {
	Key  string `json:"key,omitempty"`
	Host string `json:"host,omitempty"` // the machine that made that record
	// Same: that record is this machine's latest record of the stage.
	Same bool `json:"same"`
	// Making: the machine holding the lease of the key this machine
	// records or attempts, or of Key; Until when that lease runs out
	// unless renewed.
	Making string     `json:"making,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
	// Problem: the stage's ref names no record the store holds, or one
	// that cannot be read ('ferry store verify' lists every problem).
	Problem string `json:"problem,omitempty"`
}

// RemoteStatus is one destination of a transfer in a status report.
type RemoteStatus struct {
	Destination string `json:"destination"`
	// HashCommand is the remote tool that verified the files ("" when
	// they were read back).
	HashCommand string         `json:"hash_command,omitempty"`
	Files       []transferFile `json:"files"`
	// Verified counts the files verified there, of len(Files).
	Verified int   `json:"verified"`
	Bytes    int64 `json:"bytes"`
}

// StatusReport is the result of Status.
type StatusReport struct {
	Pipeline string `json:"pipeline"`
	// Store is this machine's store: on a shared store (Shared), its
	// cache.
	Store  string `json:"store"`
	Shared string `json:"shared,omitempty"`
	// SharedError says why the shared store could not be read (the
	// stages' Shared are then unknown, not empty).
	SharedError string             `json:"shared_error,omitempty"`
	Lock        *manifest.LockInfo `json:"lock,omitempty"`
	// LockStale: Lock's holder is a process of this host that is gone
	// (killed); the next run takes the lock over.
	LockStale bool          `json:"lock_stale,omitempty"`
	Vars      []Var         `json:"vars,omitempty"`
	Stages    []StageStatus `json:"stages"`
}

// Status reports each stage's latest record, its outputs (sizes, digests)
// and whether they are still intact by stamp. It reads no file data.
func Status(spec *Spec) (*StatusReport, error) {
	store, err := manifest.Load(spec.Store)
	if err != nil {
		return nil, err
	}
	lock, _ := store.ReadLock()
	rep := &StatusReport{Pipeline: spec.Name, Store: spec.Store, Lock: lock, LockStale: lock != nil && lock.Stale(), Vars: spec.Vars}
	for _, st := range spec.Stages {
		ss := StageStatus{Stage: st.Name, Kind: st.Kind, View: spec.ViewDir(st)}
		rec := store.StageRecord(spec.Name, st.Name)
		// A run that did not end in a record is newer than any record.
		if a := store.Attempt(spec.Name, st.Name); a != nil {
			ss.State, ss.Key, ss.Error = StatePartial, a.Key, a.Error
			ss.Resumable = store.Resumable(a.Key)
			ss.Detail = ResumableDetail(ss.Resumable)
			switch {
			case a.Error != "":
				ss.State, ss.Detail = StateFailed, a.Error
				if ss.Resumable > 0 {
					ss.Detail += "; " + ResumableDetail(ss.Resumable)
				}
			case a.Interrupted != nil:
				ss.State = StateInterrupted
			}
			if rec != nil {
				ss.Outputs = rec.Outputs
			}
			rep.Stages = append(rep.Stages, ss)
			continue
		}
		switch {
		case rec == nil && !spec.KindOf(st).Built():
			ss.State = StateNotBuilt
			ss.Detail = fmt.Sprintf("kind %q is not built yet (comes with %s)", st.Kind, spec.KindOf(st).NotBuilt)
		case rec == nil:
			ss.State = StateNeverRun
		default:
			ss.Key, ss.Outputs = rec.Key, rec.Outputs
			f := rec.Finished
			ss.Finished = &f
			if d := rec.Finished.Sub(rec.Started); d > 0 && !rec.Started.IsZero() {
				ss.Seconds = d.Seconds()
			}
			for _, o := range rec.Outputs {
				ss.Bytes += o.Size
			}
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
				if _, ok := st.Stage.(remoteResults); ok {
					remote, err := remoteStatus(store, rec)
					if err != nil {
						return nil, fmt.Errorf("stage %s: %w", st.Name, err)
					}
					ss.Remote = remote
				}
			}
		}
		rep.Stages = append(rep.Stages, ss)
	}
	return rep, nil
}

// SharedStatus adds to rep what spec's shared store holds of each stage
// (StageStatus.Shared): the record its ref names and who made it, and a
// machine holding the lease of the key this machine has or is making,
// or of that record's. It writes nothing; wrong settings are its error.
func SharedStatus(ctx context.Context, spec *Spec, rep *StatusReport) error {
	if spec.Shared == "" {
		return nil
	}
	rep.Shared = spec.Shared
	sh, err := openSharedRead(ctx, spec)
	if err != nil || sh == nil {
		return err
	}
	for i := range rep.Stages {
		ss := &rep.Stages[i]
		in := &SharedStage{}
		ref, err := sh.s.GetRef(ctx, manifest.StageRef(spec.Name, ss.Stage))
		switch {
		case err == nil:
			in.Key, in.Same = ref.Value, ref.Value == ss.Key
			rec, err := sh.s.RefRecord(ctx, ref)
			switch {
			case errkind.Of(err) == errkind.VerifyFailed:
				// This stage's alone: the others are still told.
				in.Key, in.Same, in.Problem = "", false, err.Error()
			case err != nil:
				return fmt.Errorf("%s: ref of stage %s names record %s: %w", spec.Shared, ss.Stage, ref.Value, err)
			default:
				in.Host = rec.Host
			}
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		for _, k := range []string{ss.Key, in.Key} {
			if k == "" || in.Making != "" {
				continue
			}
			li, until, live, err := sh.s.LeaseStatus(ctx, leaseName(k))
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if live {
				in.Making, in.Until = li.Holder, &until
			}
		}
		if in.Key != "" || in.Making != "" || in.Problem != "" {
			ss.Shared = in
		}
	}
	return nil
}

// ResumableDetail says how much an unfinished run left to resume from:
// "7.4 MB resumable", "nothing to resume from".
func ResumableDetail(n int64) string {
	if n == 0 {
		return "nothing to resume from"
	}
	return fmt.Sprintf("%s resumable", FormatBytes(n))
}

// FormatBytes prints a byte count for people, in powers of 1000 (as sizes
// in pipeline files are written): 266 MB, 1.5 GB, 900 KB, 12 B.
func FormatBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n), 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	prec := 0
	if v < 10 {
		prec = 1
	}
	return fmt.Sprintf("%.*f %s", prec, v, [...]string{"B", "KB", "MB", "GB", "TB"}[i])
}

// remoteStatus reads a transfer record's transfer-record.json from the
// store (a small file: it names each file once per destination).
func remoteStatus(store *manifest.Store, rec *manifest.Record) ([]RemoteStatus, error) {
	for _, o := range rec.Outputs {
		if o.Path != transferRecordFile {
			continue
		}
		if o.Size > maxTransferRecord {
			return nil, fmt.Errorf("%s is %d bytes, over %d", o.Path, o.Size, maxTransferRecord)
		}
		b, err := os.ReadFile(store.BlobPath(o.Digest))
		if err != nil {
			return nil, err
		}
		var tr transferRecord
		if err := json.Unmarshal(b, &tr); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Path, err)
		}
		var out []RemoteStatus
		for _, d := range tr.Destinations {
			rs := RemoteStatus{Destination: d.Destination, HashCommand: d.HashCommand, Files: d.Files}
			for _, f := range d.Files {
				rs.Bytes += f.Size
				if f.Verified {
					rs.Verified++
				}
			}
			out = append(out, rs)
		}
		return out, nil
	}
	return nil, nil
}
