package merge

import (
	"errors"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Sentinel errors, wrapped in *InputError with the file, tensor and offset.
var (
	ErrNoAdapter        = errors.New("not a PEFT adapter")
	ErrPickleOnly       = errors.New("pickle-only adapter")
	ErrAdapterConfig    = errors.New("invalid adapter_config.json")
	ErrAdapterKey       = errors.New("adapter tensor name not understood")
	ErrUnusedTensors    = errors.New("adapter tensors that would not be used")
	ErrMissingMagnitude = errors.New("use_dora is set but the adapter has no lora_magnitude_vector")
	ErrMissingFactor    = errors.New("adapter module lacks a LoRA factor")
	ErrNoBaseTensor     = errors.New("no base tensor for an adapter module")
	ErrShapeMismatch    = errors.New("adapter does not fit the base (made for another model?)")
	ErrRankMismatch     = errors.New("adapter rank does not match adapter_config.json")
	ErrUnsupported      = errors.New("not supported")
	ErrNothingToMerge   = errors.New("the adapter applies to nothing in the base")
	ErrOutputExists     = errors.New("output directory is in use")
	ErrJournal          = errors.New("output directory holds a different merge")
	ErrDigest           = errors.New("digest mismatch")
	ErrNonFinite        = errors.New("the adapter brings NaN or Inf into the merge")
)

// InputError is a bad-input error (exit code 2): the file, and the tensor
// and absolute byte offset where they apply.
type InputError = inputerr.Error

func inputErr(path, tensor string, off int64, sentinel error, format string, args ...any) error {
	return inputerr.New(path, tensor, off, sentinel, format, args...)
}
