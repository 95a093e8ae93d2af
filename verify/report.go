// Package verify checks artifacts before they are served. MTP checks that a
// model's multi-token-prediction (MTP / NextN) head, which speculative
// decoding needs, is really in the weight index of a GGUF file, a Hugging
// Face safetensors checkpoint or an MLX directory, and not only promised by
// the config or metadata.
//
// The check is cheap: it reads config.json, the index and the safetensors or
// GGUF headers, never weight bytes, unless Options.Deep asks for them.
package verify

import (
	"errors"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Verdict is the outcome of an MTP check.
type Verdict string

// The verdicts. OK and Absent pass; the rest fail (and Absent fails too
// when the caller requires an MTP head).
const (
	// OK: the head is promised and every expected tensor is present with
	// consistent shapes and dtypes.
	OK Verdict = "ok"
	// Absent: nothing promises a head and no head tensor is present.
	Absent Verdict = "absent"
	// Dropped: a head is promised but none of its tensors is present — the
	// serving bug this check exists for.
	Dropped Verdict = "dropped"
	// Partial: a head is promised and some, not all, of its tensors are
	// present.
	Partial Verdict = "partial"
	// Inconsistent: head tensors are present but the promised count,
	// block_count, shapes, dtypes or (with Deep) values disagree.
	Inconsistent Verdict = "inconsistent"
	// NotApplicable: the artifact is not a model that could carry a head
	// (an mmproj: the vision tower a text GGUF is loaded with). It passes,
	// with Require too: the text model beside it is what must have one.
	NotApplicable Verdict = "not_applicable"
)

// Format names the kind of artifact checked.
type Format string

// The formats MTP understands.
const (
	FormatGGUF        Format = "gguf"
	FormatSafetensors Format = "safetensors"
	FormatMLX         Format = "mlx"
)

// Convention names where a format keeps the head.
type Convention string

// The naming conventions.
const (
	// ConvQwen: Qwen3.5 / Qwen3.6 / Qwen3-Next top-level mtp.* (mtp.fc,
	// mtp.pre_fc_norm_{embedding,hidden}, mtp.norm, mtp.layers.i.*), promised
	// by mtp_num_hidden_layers (Qwen3-Next: num_nextn_predict_layers).
	ConvQwen Convention = "qwen-mtp"
	// ConvNextN: DeepSeek-V3 / GLM-4.5 extra decoder layers
	// model.layers.{num_hidden_layers+k}.* with embed_tokens, enorm, hnorm,
	// eh_proj and shared_head.*, promised by num_nextn_predict_layers.
	ConvNextN Convention = "nextn-layer"
	// ConvGGUF: llama.cpp blocks blk.N with N >= block_count -
	// nextn_predict_layers, holding blk.N.nextn.*, promised by
	// <arch>.nextn_predict_layers.
	ConvGGUF Convention = "gguf-nextn"
)

// Options tune MTP.
type Options struct {
	// Deep reads the head's tensor bytes: every value finite and the tensor
	// not all zeros (see DeepCheck for exactly what each type gets).
	Deep bool
	// Require makes Absent a failure (exit 3) as well.
	Require bool
	// FollowLinks reads files of a checkpoint directory that are symlinks
	// resolving outside it (see safetensors.DirOptions).
	FollowLinks bool
}

// Tensor is one expected or found head tensor.
type Tensor struct {
	Name     string  `json:"name"`
	Required bool    `json:"required"`
	Present  bool    `json:"present"`
	DType    string  `json:"dtype,omitempty"` // safetensors dtype or ggml type name
	Shape    []int64 `json:"shape,omitempty"` // as stored (GGUF: ne0 first)
	// Want is the shape the trunk or config implies (logical, before
	// quantization packing), when one is known.
	Want []int64 `json:"want_shape,omitempty"`
	// Problem says what is wrong with this tensor; "" when nothing is.
	Problem string `json:"problem,omitempty"`
	// Deep is what --deep found ("finite, not all zero", "not checked: …").
	Deep string `json:"deep,omitempty"`
}

// Report is the result of checking one path.
type Report struct {
	Path   string `json:"path"`
	Format Format `json:"format"`
	// Arch is config.json architectures[0] / model_type, or GGUF
	// general.architecture.
	Arch       string     `json:"arch,omitempty"`
	Convention Convention `json:"convention,omitempty"`
	// Promised is the number of MTP layers the config or metadata
	// promises; PromisedBy names the key(s) it came from ("" when none).
	Promised   int    `json:"promised"`
	PromisedBy string `json:"promised_by,omitempty"`
	// TrunkLayers is the number of ordinary decoder layers.
	TrunkLayers int `json:"trunk_layers"`
	// BlockCount is GGUF <arch>.block_count (trunk + MTP), 0 otherwise.
	BlockCount int `json:"block_count,omitempty"`
	// FoundLayers are the indices of MTP layers that hold at least one
	// tensor (Qwen: mtp.layers.i; NextN and GGUF: the block index).
	FoundLayers []int `json:"found_layers"`
	// TemplateLayer is the trunk layer the head's decoder block is compared
	// with (-1 when there is none).
	TemplateLayer int `json:"template_layer"`
	// Present counts the head's tensors in the weight index or file: every
	// one, the optional ones (GGUF shared_head_norm) and quantization
	// companions (MLX scales, biases) included, by the one definition
	// `ferry inspect` shows too (FindHead, FindGGUFHead). Expected is
	// Present plus the required tensors missing.
	Expected int `json:"expected"`
	Present  int `json:"present"`
	// Missing lists required tensors that are not in the weight index.
	Missing []string `json:"missing,omitempty"`
	// Problems lists what is inconsistent (counts, shapes, dtypes, values).
	Problems []string `json:"problems,omitempty"`
	Tensors  []Tensor `json:"tensors,omitempty"`
	Verdict  Verdict  `json:"verdict"`
	// MMProj describes the file when it is a multimodal projector
	// (verdict not_applicable).
	MMProj *gguf.MMProj `json:"mmproj,omitempty"`
	// Message explains the verdict in a sentence a user can act on.
	Message  string   `json:"message"`
	Warnings []string `json:"warnings,omitempty"`
	Notes    []string `json:"notes,omitempty"`
	// Deep reports whether tensor bytes were read; BytesRead counts them
	// (headers excluded).
	Deep      bool  `json:"deep"`
	BytesRead int64 `json:"deep_bytes_read,omitempty"`
}

// Pass reports whether the verdict lets the artifact be served: ok, not
// applicable (an mmproj), or absent unless require is set.
func (r *Report) Pass(require bool) bool {
	switch r.Verdict {
	case OK, NotApplicable:
		return true
	case Absent:
		return !require
	}
	return false
}

// Sentinel errors for inputs MTP cannot check at all (exit 2). Verdicts are
// not errors: a dropped head is a Report, not an error.
var (
	ErrNotModel    = errors.New("not a model: expected a GGUF file, a safetensors checkpoint directory or an MLX directory")
	ErrNoConfig    = errors.New("no config.json beside the weights, so nothing says whether an MTP head is promised")
	ErrBadMetadata = errors.New("invalid metadata")
)

// Error is a bad-input error from verify: the path and what is wrong.
type Error = inputerr.Error

func badf(path string, sentinel error, format string, args ...any) error {
	return inputerr.New(path, "", -1, sentinel, format, args...)
}
