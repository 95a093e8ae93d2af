package pipeline

import (
	"errors"
	"fmt"

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
