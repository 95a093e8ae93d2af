package gguf

import (
	"errors"

	"github.com/ferry-llm/ferry/internal/inputerr"
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
type Error = inputerr.Error
