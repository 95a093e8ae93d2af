// Package inputerr is the one bad-input error type of ferry's packages
// (safetensors, gguf, gguf/convert, merge, mlxpack, verify): the file, and
// the metadata key, tensor and absolute byte offset where one applies. Each
// package re-exports it under its own name, so callers keep writing
// *safetensors.Error or *gguf.Error. Its kind (internal/errkind) is
// BadInput, or the kind of the error it wraps when that has one (a layout
// that is ErrNotBuilt is not the user's fault).
package inputerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Error is a bad-input error.
type Error struct {
	Path   string
	Key    string // metadata key, "" when the error is not about one key
	Tensor string // "" when the error is not about one tensor
	Offset int64  // absolute file offset, or -1
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Key != "" {
		fmt.Fprintf(&b, ": key %q", e.Key)
	}
	if e.Tensor != "" {
		fmt.Fprintf(&b, ": tensor %q", e.Tensor)
	}
	if e.Offset >= 0 {
		fmt.Fprintf(&b, " at offset %d", e.Offset)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Kind is the kind of the wrapped error where it has one, else BadInput.
func (e *Error) Kind() errkind.Kind {
	var k errkind.Kinded
	if errors.As(e.Err, &k) {
		return k.Kind()
	}
	return errkind.BadInput
}

// BadInput reports whether the error means the user's input is wrong.
func (e *Error) BadInput() bool { return e.Kind() == errkind.BadInput }

// Wrap names path in err, which is about the file as a whole (no key,
// tensor or offset).
func Wrap(path string, err error) error { return &Error{Path: path, Offset: -1, Err: err} }

// New wraps sentinel, with an optional formatted detail, in an *Error.
func New(path, tensor string, off int64, sentinel error, format string, args ...any) error {
	if format == "" {
		return &Error{Path: path, Tensor: tensor, Offset: off, Err: sentinel}
	}
	return &Error{Path: path, Tensor: tensor, Offset: off, Err: fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)}
}
