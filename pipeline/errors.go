package pipeline

import (
	"errors"
	"fmt"
)

// ErrSpec is wrapped by every error about the pipeline file itself.
var ErrSpec = errors.New("bad pipeline file")

// ErrNotBuilt reports a stage kind whose package has not landed yet.
var ErrNotBuilt = errors.New("stage kind is not built yet")

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

// BadInput marks the error as the user's input being wrong (exit 2).
func (e *SpecError) BadInput() bool { return true }

func (e *SpecError) Unwrap() error { return ErrSpec }
