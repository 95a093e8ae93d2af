// Package inputerr is the one bad-input error type of ferry's format
// packages (safetensors, gguf, gguf/convert, merge): the file, and the
// metadata key, tensor and absolute byte offset where one applies. Each
// package re-exports it under its own name, so callers keep writing
// *safetensors.Error or *gguf.Error; the CLI maps BadInput to exit code 2.
package inputerr

import (
	"fmt"
	"strings"
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

// BadInput marks the error as the user's input being wrong (exit code 2).
func (e *Error) BadInput() bool { return true }

// New wraps sentinel, with an optional formatted detail, in an *Error.
func New(path, tensor string, off int64, sentinel error, format string, args ...any) error {
	if format == "" {
		return &Error{Path: path, Tensor: tensor, Offset: off, Err: sentinel}
	}
	return &Error{Path: path, Tensor: tensor, Offset: off, Err: fmt.Errorf("%w: "+format, append([]any{sentinel}, args...)...)}
}
