// Package convert turns a Hugging Face safetensors checkpoint into a GGUF
// file with the tensors and metadata llama.cpp's convert_hf_to_gguf.py
// (34af94c) writes.
//
// The work is split as STYLE.md asks: Plan reads config.json, the tokenizer
// files and every shard header into an inventory, checks it, and decides
// every output tensor (name, ggml type, shape, the rows of which source
// tensors it is made of, and the element transform) and the whole GGUF
// header, without reading a weight byte. Write executes a plan: it streams
// each output tensor in row blocks from a bounded pool of workers and writes
// them at their planned offsets.
//
// Each model family is a descriptor in internal/family (its names, layouts,
// GGUF arch, tensor stems and writer class); the writer of each
// convert_hf_to_gguf.py class lives in its own file here and is listed in
// writers below.
package convert

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Sentinel errors; all are reported as bad input (exit 2) through *Error.
var (
	ErrUnsupportedArch = errors.New("unsupported architecture")
	ErrMissingTensor   = errors.New("missing tensor")
	ErrUnknownTensor   = errors.New("tensor the converter cannot map")
	ErrShape           = errors.New("tensor shape does not match the config")
	ErrConfig          = errors.New("invalid or incomplete config")
	ErrMTPMissing      = errors.New("config promises MTP layers but the checkpoint has no mtp.* tensors")
	ErrTokenizer       = errors.New("unsupported or invalid tokenizer")
	ErrOptions         = errors.New("invalid options")
)

// Error is a conversion input error: the file (and tensor, and offset where
// one applies) and what is wrong.
type Error = inputerr.Error

func errf(path, tensor string, off int64, sentinel error, format string, args ...any) error {
	return inputerr.New(path, tensor, off, sentinel, format, args...)
}

// OutType is the --outtype of the converter.
type OutType string

// Output types.
const (
	OutF16  OutType = "f16"
	OutBF16 OutType = "bf16"
	OutF32  OutType = "f32"
	OutQ8_0 OutType = "q8_0"
	OutAuto OutType = "auto"
)

// ParseOutType parses an --outtype or a gguf stage's outtype, in any case;
// "" is the default, f16.
func ParseOutType(s string) (OutType, error) {
	switch o := OutType(strings.ToLower(s)); o {
	case "":
		return OutF16, nil
	case OutF16, OutBF16, OutF32, OutQ8_0, OutAuto:
		return o, nil
	}
	return "", fmt.Errorf("want f16, bf16, f32, q8_0 or auto, got %q", s)
}

// fileType is the general.file_type of a file converted to o (gguf-py
// LlamaFileType): the file type of o's ggml type.
func (o OutType) fileType() quant.FileType {
	f, _ := quant.FileTypeOf(o.ggml())
	return f
}

// ggml is the ggml type o asks for; auto must be resolved first.
func (o OutType) ggml() quant.Type {
	switch o {
	case OutF32:
		return quant.F32
	case OutBF16:
		return quant.BF16
	case OutQ8_0:
		return quant.Q8_0
	}
	return quant.F16
}

// Options are the converter flags.
type Options struct {
	OutType OutType // default f16
	// NoMTP drops the mtp.* tensors (convert_hf_to_gguf.py --no-mtp).
	NoMTP bool
	// MTPOnly writes only the MTP block plus token_embd, output_norm and
	// output (convert_hf_to_gguf.py --mtp).
	MTPOnly bool
	// Pre overrides tokenizer.ggml.pre (default: by model family).
	Pre string
	// Name overrides general.name (convert_hf_to_gguf.py --model-name).
	Name string
	// MMProj writes the vision tower as a multimodal projector
	// (convert_hf_to_gguf.py --mmproj): architecture clip, no text weights
	// and no tokenizer (qwen3vl_vision.go). NoMTP, MTPOnly and Pre do not
	// apply to it.
	MMProj bool
	// Policy chooses each tensor's ggml type from its name, dims and the
	// type OutType asks for; nil is DefaultPolicy. The plan refuses a
	// choice ferry cannot encode or whose blocks do not divide the row.
	Policy quant.Policy
	// Split writes the file as the parts llama-gguf-split --split would
	// cut it into (--split-max-size, --split-max-tensors): Plan.Layout
	// then has a Split, and Run writes the parts directly.
	Split gguf.SplitOptions
}

// Supported lists the Hugging Face architectures the converter handles:
// every layout of a family (internal/family) whose GGUF writer class is
// one of writers.
func Supported() []string {
	return desc.Architectures(func(f *desc.Family, _ desc.Layout) bool { return f.GGUF != nil && writers[f.GGUF.Class] != nil })
}

// writers maps a family descriptor's GGUF.Class (the convert_hf_to_gguf.py
// class whose transforms it applies) to the writer that applies them. A
// family whose transforms are an existing class's is one descriptor in
// internal/family; a new class is a new file here and one line.
var writers = map[string]func(g *desc.GGUF) family{
	"LlamaModel":          newLlama,
	"Qwen2Model":          newQwen2,
	"Qwen3Model":          newQwen3,
	"Qwen3MoeModel":       newQwen3MoE,
	"Qwen3_5TextModel":    newQwen35,
	"Qwen3_5MoeTextModel": newQwen35MoE,
	"Qwen3NextModel":      newQwen3Next,
}

// writerFor is the writer of a config.json architectures[0]: its family's
// descriptor, the writer of the descriptor's class.
func writerFor(arch string) (family, error) {
	f, _, ok := desc.ByArchitecture(arch)
	if !ok || f.GGUF == nil || f.GGUF.Class == "" {
		return nil, fmt.Errorf("architectures[0] is %q; supported: %s", arch, strings.Join(Supported(), ", "))
	}
	newWriter, ok := writers[f.GGUF.Class]
	if !ok {
		return nil, fmt.Errorf("architectures[0] is %q, family %s, whose GGUF writer class %s ferry does not have (classes: %s)", arch, f.Name, f.GGUF.Class, strings.Join(classNames(), ", "))
	}
	return newWriter(f.GGUF), nil
}

func classNames() []string {
	out := make([]string, 0, len(writers))
	for k := range writers {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// namesOf is the name map of a descriptor's architecture.
func namesOf(g *desc.GGUF) nameMapper { return newNameMapper(g.PostAttentionNorm, g.Tensors...) }

// family is one model family's conversion rules. The model struct carries
// the shared state; a family only adds its own metadata keys and tensor
// transforms, in the order convert_hf_to_gguf.py's class chain applies them.
type family interface {
	// arch is the GGUF general.architecture.
	arch() string
	// init reads and checks the family's config values, before the tensors
	// are mapped (so block_count, MTP counts and head sizes are known).
	init(m *model) error
	// params appends the {arch}.* keys (set_gguf_parameters).
	params(m *model, kv *kvList) error
	// modify maps one (filtered, renamed) source tensor to zero or more
	// output tensors; it may hold tensors back (expert stacking).
	modify(m *model, t *vtensor, bid int) ([]*vtensor, error)
	// finish reports tensors held back and never emitted.
	finish(m *model) error
	// vocab writes the tokenizer keys.
	vocab(m *model, kv *kvList) error
}

// String describes a tensor plan in one line: name, type, ggml dims,
// sources and transforms.
func (t TensorPlan) String() string {
	s := fmt.Sprintf("%-40s %-5s %v ← %s", t.Name, t.Type, t.Dims, strings.Join(t.Sources, ", "))
	if len(t.Steps) > 0 {
		s += " [" + strings.Join(t.Steps, ", ") + "]"
	}
	return s
}

// DefaultFileName is gguf-py's naming_convention, the name the converter
// gives an output directory: <basename or name>[-<size>][-<finetune>]
// [-<version>]-<TYPE>.gguf; with --mtp-only the size is left out and the
// name gets an mtp- prefix; for an mmproj (MmprojModel.prepare_metadata)
// the size is left out and the prefix is mmproj-.
func (p *Plan) DefaultFileName(mtpOnly bool) string {
	get := func(k string) (string, bool) {
		for _, kv := range p.KVs {
			if kv.Key == k {
				s, ok := kv.String()
				return s, ok
			}
		}
		return "", false
	}
	clean := func(s string) string { return strings.ReplaceAll(strings.TrimSpace(s), " ", "-") }
	name := "ggml-model"
	if b, ok := get("general.basename"); ok {
		name = strings.ReplaceAll(clean(b), "/", "-")
	} else if n, ok := get("general.name"); ok {
		name = strings.ReplaceAll(clean(n), "/", "-")
	}
	if s, ok := get("general.size_label"); ok && !mtpOnly && !p.MMProj {
		name += "-" + s
	}
	for _, k := range []string{"general.finetune", "general.version"} {
		if s, ok := get(k); ok {
			name += "-" + clean(s)
		}
	}
	name += "-" + strings.ToUpper(string(p.OutType))
	switch {
	case p.MMProj:
		name = "mmproj-" + name
	case mtpOnly:
		name = "mtp-" + name
	}
	return name + ".gguf"
}
