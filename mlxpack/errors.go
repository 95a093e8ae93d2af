// Package mlxpack turns checkpoints into directories mlx-lm loads.
//
// Repack carries a compressed-tensors "pack-quantized" checkpoint (int
// weights packed into int32, group scales, symmetric) to MLX without
// requantizing: the packed words are already MLX's affine layout, so the
// output is a farm of symlinks to the source files plus a config.json with
// a derived "quantization" block. For model families whose mlx-lm sanitize
// does not rename weight_packed → weight, Rewrite writes new shards for the
// tensors that need MLX names (weight as the U32 view, scales, biases =
// −2^(bits−1)·scales) and links the rest; for families whose sanitize
// stacks only experts' .weight into switch_mlp (qwen3_moe, qwen3_5_moe) it
// writes the packed experts already stacked, streaming expert after expert.
//
// The stage has the house shape: PlanRepack reads headers (and the tiny
// weight_shape tensors) and makes every decision; Repack executes the plan.
package mlxpack

import (
	"errors"

	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Sentinel errors of mlx repack, mlx quantize and PlanQuant; bad-input
// ones arrive wrapped in *Error.
var (
	// mlx repack.
	ErrNoQuantConfig     = errors.New("config.json has no quantization_config")
	ErrNotCompressed     = errors.New("quantization_config is not compressed-tensors")
	ErrFormat            = errors.New("compressed-tensors format MLX cannot load as is")
	ErrAsymmetric        = errors.New("asymmetric quantization (zero points): MLX affine repack needs symmetric int weights")
	ErrActOrder          = errors.New("activation ordering (g_idx): MLX groups are contiguous columns")
	ErrStrategy          = errors.New("quantization strategy MLX cannot express")
	ErrBits              = errors.New("bit width MLX affine cannot express")
	ErrGroupSize         = errors.New("group size MLX affine cannot express")
	ErrActivations       = errors.New("activation quantization MLX cannot express")
	ErrMixed             = errors.New("mixed quantization settings MLX cannot express here")
	ErrInconsistent      = errors.New("packed tensor does not match the declaration")
	ErrNeedsRewrite      = errors.New("mlx-lm does not rename weight_packed for this model type")
	ErrDestination       = errors.New("destination refused")
	ErrNoConfig          = errors.New("no config.json")
	ErrDestinationInside = errors.New("destination inside the source")

	// mlx quantize.
	ErrSanitize          = errors.New("checkpoint does not have the layout mlx-lm's sanitize expects")
	ErrUnsupportedFamily = errors.New("model type mlx quantize does not convert")
	ErrQuantized         = errors.New("checkpoint is already quantized")
	ErrQuantArgs         = errors.New("quantization setting MLX affine cannot express")
	ErrOutput            = errors.New("output refused")
	ErrUnsupportedDType  = errors.New("tensor dtype mlx quantize does not convert")

	// PlanQuant and ParseModuleBits.
	ErrRecipe       = errors.New("mixed quantization recipe")
	ErrModuleBits   = errors.New("bad --module-bits override")
	ErrNotDivisible = errors.New("the last dimension is not a multiple of the group size")
	ErrQuantFamily  = errors.New("model type ferry cannot quantize for MLX")
)

// Error is a bad-input error about the source checkpoint or the
// destination: the file, the tensor where one applies, and what is wrong.
// One that wraps ErrNotBuilt is of kind NotBuilt, not bad input.
type Error = inputerr.Error

func errf(path, tensor string, sentinel error, format string, args ...any) error {
	return inputerr.New(path, tensor, -1, sentinel, format, args...)
}
