// Package safetensors reads and writes the safetensors format and Hugging
// Face checkpoint directories, streaming: a reader parses and validates the
// header and hands out each tensor as an io.SectionReader; nothing ever holds
// a whole file.
package safetensors

import (
	"errors"
	"fmt"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Sentinel errors, wrapped in *Error with the file, tensor and offset.
var (
	ErrTruncated       = errors.New("file too short")
	ErrHeaderTooLarge  = errors.New("header length over the 100,000,000-byte limit")
	ErrHeaderLength    = errors.New("header length past the end of the file")
	ErrInvalidHeader   = errors.New("invalid header")
	ErrDuplicateTensor = errors.New("duplicate tensor name")
	ErrUnknownDType    = errors.New("unknown dtype")
	ErrInvalidOffset   = errors.New("invalid data offsets")
	ErrSizeMismatch    = errors.New("byte length does not match shape × dtype")
	ErrTrailingBytes   = errors.New("bytes after the last tensor")
	ErrInvalidIndex    = errors.New("invalid index")
	ErrMissingShard    = errors.New("missing shard")
	ErrStrayShard      = errors.New("shard not named by the index")
	ErrMissingTensor   = errors.New("tensor missing from its shard")
	ErrTensorTwice     = errors.New("tensor in two shards")
	ErrOutsideDir      = errors.New("path leaves the checkpoint directory")
	ErrNotCheckpoint   = errors.New("not a safetensors checkpoint")
	ErrWriteSize       = errors.New("wrote a different number of bytes than declared")
	ErrWriteOrder      = errors.New("tensor written out of declared order")
	ErrInvalidConfig   = errors.New("invalid config.json")
)

// Finer sentinels; each also matches the broader one it wraps, so
// errors.Is(err, ErrInvalidOffset) holds for both an overlap and a gap.
var (
	ErrOverlap         = fmt.Errorf("%w: tensors overlap", ErrInvalidOffset)
	ErrGap             = fmt.Errorf("%w: gap between tensors", ErrInvalidOffset)
	ErrUnindexedTensor = fmt.Errorf("%w: tensor in a shard but not in the index", ErrInvalidIndex)
	ErrSymlinkOutside  = fmt.Errorf("%w: symlink resolves outside the directory", ErrOutsideDir)
)

// Error is a bad-input error: the file (and tensor, and absolute byte
// offset where one applies) and what is wrong.
type Error = inputerr.Error

func errf(path, tensor string, off int64, sentinel error, format string, args ...any) error {
	return inputerr.New(path, tensor, off, sentinel, format, args...)
}
