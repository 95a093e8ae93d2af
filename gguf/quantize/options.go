package quantize

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/errkind"
)

// ErrOption: a malformed per-tensor option (--tensor-type,
// --output-tensor-type, --token-embedding-type, --mtp-type).
var ErrOption = errkind.New(errkind.Usage, "invalid quantization option")

// ParseTensorType parses llama-quantize's --tensor-type argument,
// PATTERN=TYPE, split at the first '=' (parse_tensor_type).
func ParseTensorType(s string) (quant.TensorType, error) {
	pattern, typ, ok := strings.Cut(s, "=")
	if !ok {
		return quant.TensorType{}, fmt.Errorf("%w: --tensor-type %q: want PATTERN=TYPE", ErrOption, s)
	}
	return NewTensorType(pattern, typ)
}

// NewTensorType is the override of the tensors whose names pattern (a
// regular expression, lower-cased as llama-quantize lower-cases it, found
// anywhere in the name) matches, with the ggml type named typ.
func NewTensorType(pattern, typ string) (quant.TensorType, error) {
	if pattern == "" {
		return quant.TensorType{}, fmt.Errorf("%w: tensor type override =%s: missing tensor name pattern", ErrOption, typ)
	}
	if _, err := regexp.Compile(strings.ToLower(pattern)); err != nil {
		return quant.TensorType{}, fmt.Errorf("%w: tensor type override %q: %v (Go RE2 syntax: no back-references or look-arounds)", ErrOption, pattern, err)
	}
	t, err := ParseTensorTypeName(typ)
	if err != nil {
		return quant.TensorType{}, fmt.Errorf("tensor type override %s=%s: %w", pattern, typ, err)
	}
	return quant.TensorType{Pattern: pattern, Type: t}, nil
}

// ParseTensorTypeName is the ggml tensor type named s (q8_0, Q4_K, f16 …,
// case-insensitive, as llama-quantize's parse_ggml_type), refused when
// ferry cannot write it.
func ParseTensorTypeName(s string) (quant.Type, error) {
	t, ok := quant.ParseType(s)
	if !ok || !t.CanEncode() {
		return 0, fmt.Errorf("%w: %q is not a ggml type ferry can write (%s)", ErrOption, s, writable())
	}
	return t, nil
}

// writable lists the ggml types ferry can write, lower-cased as
// llama-quantize's users spell them, in type-code order.
func writable() string {
	var names []string
	for _, t := range quant.Types() {
		if t.CanEncode() {
			names = append(names, strings.ToLower(t.String()))
		}
	}
	return strings.Join(names, ", ")
}
