package pipeline

import (
	"time"

	"github.com/ferry-llm/ferry/manifest"
)

// EventType names an Event.
type EventType string

// The events of a run, in the order a stage sees them.
const (
	EventStart    EventType = "start"    // the run begins: Total stages selected
	EventSkip     EventType = "skip"     // a stage is up to date
	EventRun      EventType = "run"      // a stage starts (Reason, Cause)
	EventProgress EventType = "progress" // a running stage's bytes, or its upload's (Phase; sent by the CLI's progress reporter)
	EventDone     EventType = "done"     // a stage finished (Seconds, Bytes, Outputs)
	EventFailed   EventType = "failed"   // a stage failed (Error)
	// A running stage was stopped by the run's cancellation (Ctrl-C,
	// SIGTERM): Seconds it ran, Reason what it left to resume.
	EventInterrupted EventType = "interrupted"
	EventBlocked     EventType = "blocked" // a stage cannot run: an input did not complete
	// Another machine holds the stage's lease on the shared store: Reason
	// "being made on HOST, lease until T", Holder and Until. Sent again
	// when the holder or the time changes; the stage then skips (its
	// record appeared) or runs (the lease ended without one).
	EventWaiting EventType = "waiting"
	// A stage made here is in the shared store, behind the run: Seconds
	// its upload took (its outputs' Bytes), Reason where it went.
	EventShared EventType = "shared"
	// The run or a stage logged a warning (a record at Warn level or
	// above; the log line stays): Stage and Kind the stage it is about
	// ("" for the run), Reason the message and its attributes as one
	// line, "message key=value …" (the line the Report keeps), and Attrs
	// the attributes by name. One may come before start (a stale store
	// lock taken over, an input checked before the run).
	EventWarning EventType = "warning"
	EventEnd     EventType = "end" // the run ended (Report, Error)
)

// PhaseShare is the Phase of a stage's upload's progress events.
const PhaseShare = "share"

// Event is one thing that happened in a run, for displays and for the
// JSON event stream of `ferry pipeline run --events` (one object a line).
// Index is the stage's place in the run's order among the Total stages
// selected ("stage 3 of 8"); independent stages may run at once.
type Event struct {
	Time  time.Time `json:"time"`
	Event EventType `json:"event"`
	Stage string    `json:"stage,omitempty"`
	Kind  string    `json:"kind,omitempty"`
	// Phase of a progress event: "" the stage's own work, PhaseShare its
	// upload to the shared store (while it runs, the outputs it finished
	// early; after it, the rest).
	Phase   string            `json:"phase,omitempty"`
	Index   int               `json:"index,omitempty"`
	Total   int               `json:"total,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	Cause   Cause             `json:"cause,omitempty"`
	View    string            `json:"view,omitempty"`
	Outputs []manifest.Output `json:"outputs,omitempty"`
	Seconds float64           `json:"seconds,omitempty"`
	// Bytes: outputs' total (done, skip); bytes done so far (progress).
	Bytes int64 `json:"bytes,omitempty"`
	// Of, Rate (bytes/s) and ETA (seconds) of a progress event; Of ≤ 0
	// when the stage does not know its total yet.
	Of    int64   `json:"of,omitempty"`
	Rate  float64 `json:"rate,omitempty"`
	ETA   float64 `json:"eta,omitempty"`
	Error string  `json:"error,omitempty"`
	// Attrs are a warning's attributes, key to value as text (a group's
	// keys joined with "."; a time in RFC 3339), without the stage.
	Attrs map[string]string `json:"attrs,omitempty"`
	// Holder and Until: who holds the lease of a waiting stage, and until
	// when unless renewed.
	Holder string     `json:"holder,omitempty"`
	Until  *time.Time `json:"until,omitempty"`
	// Report is the run's report (end).
	Report *Report `json:"report,omitempty"`
}

// outputBytes is the total size of outs.
func outputBytes(outs []manifest.Output) int64 {
	var n int64
	for _, o := range outs {
		n += o.Size
	}
	return n
}
