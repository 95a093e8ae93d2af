package pipeline

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// ErrSpec is wrapped by every error about the pipeline file itself.
var ErrSpec = errors.New("bad pipeline file")

// SpecError is a problem in a pipeline file, with the YAML line it is on.
// It is bad input: the CLI exits 2.
type SpecError struct {
	File  string
	Line  int
	Stage string // "" for file-level errors
	Msg   string
}

func (e *SpecError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Stage != "" {
		return fmt.Sprintf("%s: stage %q: %s", loc, e.Stage, e.Msg)
	}
	return fmt.Sprintf("%s: %s", loc, e.Msg)
}

// Kind says the error is the user's input being wrong (exit 2).
func (e *SpecError) Kind() errkind.Kind { return errkind.BadInput }

func (e *SpecError) Unwrap() error { return ErrSpec }

// InterruptedError is how Run ends when its context is cancelled (Ctrl-C,
// SIGTERM): the stages that were running then, each stopped where it was
// with what it left to resume, and the errors of stages that had failed
// before. Its kind is Interrupted; errors.Is finds the context's error and
// each failure. Its message says all that and never ends in the context's
// "context canceled", which tells a user nothing.
type InterruptedError struct {
	Running []InterruptedStage // in the pipeline file's order
	// Sharing are the stages made here whose upload to the shared store
	// SharedTo the interrupt stopped (the next run shares them).
	Sharing  []string
	SharedTo string
	Failed   []error // "stage NAME: why", in the pipeline file's order
	Err      error   // the context's error
}

// InterruptedStage is a stage that was running when its run was
// cancelled.
type InterruptedStage struct {
	Stage     string
	Resumable int64 // bytes of journals and work dir the next run continues from
}

// Left says what the interrupted run left: "stage merged was running
// (7.4 MB resumable); the stages that finished are recorded", then the
// failures before the interrupt.
func (e *InterruptedError) Left() string {
	var b strings.Builder
	switch len(e.Running) {
	case 0:
		b.WriteString("no stage was running")
	case 1:
		fmt.Fprintf(&b, "stage %s was running (%s)", e.Running[0].Stage, ResumableDetail(e.Running[0].Resumable))
	default:
		b.WriteString("stages ")
		for i, r := range e.Running {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (%s)", r.Stage, ResumableDetail(r.Resumable))
		}
		b.WriteString(" were running")
	}
	b.WriteString("; the stages that finished are recorded")
	if len(e.Sharing) > 0 {
		fmt.Fprintf(&b, "; %s not in %s yet (it was uploading: the next run shares it)", strings.Join(e.Sharing, ", "), e.SharedTo)
	}
	for _, f := range e.Failed {
		b.WriteString("; failed before the interrupt: ")
		b.WriteString(f.Error())
	}
	return b.String()
}

func (e *InterruptedError) Error() string { return "interrupted; " + e.Left() }

// Unwrap gives the context's error and the failures.
func (e *InterruptedError) Unwrap() []error { return append([]error{e.Err}, e.Failed...) }

// Kind says the run was interrupted (exit 130).
func (e *InterruptedError) Kind() errkind.Kind { return errkind.Interrupted }
