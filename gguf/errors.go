package gguf

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors, wrapped in *Error with the file, key or tensor, and the
// absolute byte offset.
var (
	ErrBadMagic        = errors.New("not a GGUF file (bad magic)")
	ErrVersion         = errors.New("unsupported GGUF version")
	ErrTruncated       = errors.New("file too short")
	ErrTooLarge        = errors.New("count or length over the limit")
	ErrValueType       = errors.New("invalid metadata value type")
	ErrDuplicateKey    = errors.New("duplicate metadata key")
	ErrAlignment       = errors.New("invalid general.alignment")
	ErrTensorName      = errors.New("invalid tensor name")
	ErrDuplicateTensor = errors.New("duplicate tensor name")
	ErrDims            = errors.New("invalid tensor dimensions")
	ErrUnknownType     = errors.New("unknown ggml type")
	ErrBlockSize       = errors.New("row length is not a multiple of the block size")
	ErrOffset          = errors.New("tensor data offset is not contiguous")
	ErrDataRange       = errors.New("tensor data past the end of the file")

	// Writer errors.
	ErrWriteSize  = errors.New("wrote a different number of bytes than the tensor's size")
	ErrWriterDone = errors.New("writer already closed")
)

// Error is a bad-input error naming the file, the key or tensor, and the
// absolute byte offset where reading went wrong.
type Error struct {
	Path   string
	Key    string // metadata key, "" when not about one key
	Tensor string // tensor name, "" when not about one tensor
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
