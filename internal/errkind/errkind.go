// Package errkind is ferry's one error taxonomy: every error a command can
// end with falls in one Kind, and the CLI maps kinds to exit codes in one
// place (cmd/ferry/exit.go). Packages give an error its kind without
// changing its message: a sentinel made by New (errors.Is still works), an
// error wrapped by Mark, or a type with a Kind method (internal/inputerr's
// Error is BadInput).
package errkind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
)

// Kind is the category of an error.
type Kind uint8

// The kinds.
const (
	// Failure is everything not classified otherwise: a bug, a full disk,
	// an I/O error that will not go away by itself.
	Failure Kind = iota
	// Usage: a bad command line or flag value.
	Usage
	// BadInput: a file the user gave is wrong (names the file, and the
	// tensor and offset where they apply) or does not exist.
	BadInput
	// NotBuilt: the input is fine but the feature it needs is not built.
	NotBuilt
	// VerifyFailed: a check ran and failed, or the store is damaged (a
	// blob vanished or changed under its digest).
	VerifyFailed
	// Retryable: an I/O error that may pass (a dropped connection, a
	// timeout); the operation can be tried again as is.
	Retryable
	// Interrupted: the run was cancelled (Ctrl-C, SIGTERM); what it wrote
	// is resumable.
	Interrupted
)

var kindNames = [...]string{"failure", "usage", "bad input", "not built", "verification failed", "retryable", "interrupted"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Kinded is implemented by errors that know their kind.
type Kinded interface {
	error
	Kind() Kind
}

// Of is the kind of err: that of the outermost error in its chain with a
// Kind method; else Interrupted for a cancelled context, BadInput for a
// path that does not exist, and Failure for the rest. Of(nil) is Failure;
// callers check for nil first.
func Of(err error) Kind {
	var k Kinded
	switch {
	case errors.As(err, &k):
		return k.Kind()
	case errors.Is(err, context.Canceled):
		return Interrupted
	case errors.Is(err, fs.ErrNotExist):
		return BadInput
	}
	return Failure
}

// sentinel is an error value of a fixed kind, for errors.Is.
type sentinel struct {
	kind Kind
	msg  string
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Kind() Kind    { return e.kind }

// New returns a sentinel error of kind k: errors.Is matches it, and any
// error wrapping it has kind k (unless an outer error says otherwise).
func New(k Kind, msg string) error { return &sentinel{kind: k, msg: msg} }

// marked gives an error a kind and leaves its message alone.
type marked struct {
	kind Kind
	err  error
}

func (e *marked) Error() string { return e.err.Error() }
func (e *marked) Unwrap() error { return e.err }
func (e *marked) Kind() Kind    { return e.kind }

// Mark returns err with kind k; the message and the chain (errors.Is,
// errors.As) are err's. Mark(k, nil) is nil.
func Mark(k Kind, err error) error {
	if err == nil {
		return nil
	}
	return &marked{kind: k, err: err}
}

// Errorf is Mark(k, fmt.Errorf(format, args...)).
func Errorf(k Kind, format string, args ...any) error {
	return Mark(k, fmt.Errorf(format, args...))
}

// ErrNotBuilt is wrapped by every error about a feature that is not built
// yet (a stage kind, a model layout a writer does not handle).
var ErrNotBuilt = New(NotBuilt, "not built")
