// Package quantize quantizes a GGUF file as llama-quantize does (llama.cpp
// 34af94c, no importance matrix): the same tensor order, types, KVs,
// alignment and bytes. It owns the whole write lifecycle, like
// gguf/convert's Run: NewPlan reads the input's header and decides
// everything before a byte is written (types from quant.Mix, every size and
// offset, the checks of the input and of the disk), Run streams the tensors
// in row blocks through N workers into OUT.partial with a resume journal
// and renames it into place. `ferry quantize` and the pipeline's quantize
// stage both call them.
//
// Facts: ../shared/notes/llamacpp.md §3.7 (the output file), §1 (GGUF), §5
// (MTP/NextN).
package quantize

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/inputerr"
)

// Errors a plan refuses with. Those about the input are wrapped in an
// *inputerr.Error naming the file and tensor (bad input, exit 2); the
// others are usage errors.
var (
	// ErrFileType: a quantization type llama-quantize would not make
	// without an importance matrix, or one ferry does not know.
	ErrFileType = errkind.New(errkind.Usage, "unsupported quantization type")
	// ErrRequantize: the input holds quantized tensors that would be
	// quantized again, without AllowRequantize.
	ErrRequantize = errors.New("tensor is already quantized (pass --allow-requantize to quantize it again, at a loss of quality)")
	// ErrInputType: a tensor of a type that cannot be decoded (I32, …)
	// would have to change type.
	ErrInputType = errors.New("unsupported input tensor type")
	// ErrModel: the hparams the type rules read (general.architecture,
	// {arch}.block_count, head counts) are missing or malformed.
	ErrModel = errors.New("model metadata the type rules need")
	// ErrMTPMissing: {arch}.nextn_predict_layers promises NextN layers
	// whose blk.N.nextn.* tensors are not in the file.
	ErrMTPMissing = errors.New("the header promises NextN (MTP) layers whose tensors are missing")
	// ErrNonFinite: a quantized block's scale came out NaN or infinite
	// (llama-quantize: "quantized data validation failed").
	ErrNonFinite = errors.New("quantized data validation failed")
	// ErrImatrixMissing: tensors whose type needs importance data (the
	// Q2_K tensors of a Q2_K_S file) that the matrix has no entries for.
	ErrImatrixMissing = errkind.New(errkind.Usage, "missing importance matrix entries")
	// ErrImatrix: an importance matrix that does not fit the model.
	ErrImatrix = errkind.New(errkind.BadInput, "importance matrix does not fit the model")
	// ErrMTPType: --mtp-type for a model without NextN/MTP layers.
	ErrMTPType = errkind.New(errkind.Usage, "no MTP block to keep")
)

// Options say what to make.
type Options struct {
	FileType quant.FileType
	// AllowRequantize quantizes tensors that are already quantized
	// (decoded to f32 first), as llama-quantize --allow-requantize.
	AllowRequantize bool
	// OutputType and TokenEmbdType force the type of output.weight and
	// token_embd.weight (--output-tensor-type, --token-embedding-type).
	OutputType, TokenEmbdType *quant.Type
	// LeaveOutput keeps output.weight as it is (--leave-output-tensor).
	LeaveOutput bool
	// Pure gives every quantized tensor the default type of FileType
	// (--pure).
	Pure bool
	// TensorTypes are the --tensor-type REGEX=TYPE overrides, in the
	// order given: the first pattern found in a tensor's name sets its
	// type (quant.TensorType).
	TensorTypes []quant.TensorType
	// MTPType, if set, is the type of every quantizable tensor of the
	// NextN/MTP blocks (--mtp-type; quant.MixOptions.MTPType): tensors
	// that are never quantized (norms, 1-D tensors) stay as they are.
	MTPType *quant.Type
	// Imatrix is the importance matrix (--imatrix, already filtered by
	// --include-weights/--exclude-weights), nil for none. A matrix with
	// no entries is no matrix, as in llama-quantize.
	Imatrix *imatrix.Matrix
	// ImatrixFile is the matrix's name as given on the command line,
	// written as quantize.imatrix.file (default: Imatrix.Path()).
	ImatrixFile string
	// Split writes the output as the parts llama-gguf-split --split would
	// cut it into (--split-max-size, --split-max-tensors): Plan.Layout
	// then has a Split, and Run writes the parts directly.
	Split gguf.SplitOptions
}

// hasImatrix reports whether a matrix with entries is given.
func (o *Options) hasImatrix() bool { return o.Imatrix != nil && o.Imatrix.Len() > 0 }

// TensorPlan is one output tensor.
type TensorPlan struct {
	Name   string
	Dims   []uint64        // as written: trailing 1s dropped (ggml_n_dims)
	InType quant.Type      // the input's type
	Type   quant.Type      // the type written; == InType: copied byte for byte
	In     gguf.TensorInfo // the input tensor
	Bytes  int64           // output bytes, without padding
	// Weights is the importance vector the tensor is quantized with
	// (ne0 values per expert, imatrix.Matrix.Weights), nil for none.
	Weights []float32
	// By names the option that set Type (quant.Choice.By), "" for the
	// type rules.
	By string
}

// Copy reports whether the tensor is copied unchanged.
func (t *TensorPlan) Copy() bool { return t.Type == t.InType }

// Plan is a complete, deterministic quantization plan. It holds no weight
// data; Run executes it.
type Plan struct {
	Input    string // the input file's path
	Arch     string // general.architecture
	FileType quant.FileType
	Options  Options
	Model    quant.Model
	KVs      []gguf.KV
	Tensors  []TensorPlan // in the loader's order (quant.LoaderLess)
	Layout   *gguf.Layout
	// InputBytes is the tensor bytes read from the input.
	InputBytes int64
	// MTPLayers is {arch}.nextn_predict_layers (0 when none).
	MTPLayers int
	// Unweighted lists the tensors quantized without importance data
	// although a matrix is given (it has no entry for them; for a
	// Qwen3.5 model, the MTP block, which llama-imatrix never runs), as
	// llama-quantize does ("did not find weights for …").
	Unweighted []string

	// inputStamp identifies the input in Stamp when it is not a plain
	// file (Source.NewPlan: a checkpoint read through gguf/convert).
	inputStamp string
}

// ParseType is the file type named s (llama-quantize's names and aliases,
// case-insensitive), refused as ErrFileType when unknown or not supported.
// Q2_K_S is accepted: NewPlan refuses it without an importance matrix.
func ParseType(s string) (quant.FileType, error) {
	f, err := quant.LookupFileType(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w (want Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K or a legacy Q4_0, Q4_1, Q5_0, Q5_1)", ErrFileType, err)
	}
	if err := checkFileType(f); err != nil {
		return 0, err
	}
	return f, nil
}

func checkFileType(f quant.FileType) error {
	if !f.Known() {
		return fmt.Errorf("%w: file type %d", ErrFileType, uint32(f))
	}
	return nil
}

// decodable reports whether a tensor of type t can be read as float32: a
// type with a decoder in the type table, or any block-quantized type, so
// that a quantized input is refused as a requantization first, as
// llama-quantize refuses it (with --allow-requantize, one ferry has no
// decoder for fails in quant.Decode).
func decodable(t quant.Type) bool { return t.CanDecode() || t.Quantized() }

// NewPlan plans the quantization of the opened GGUF file f. Everything that
// can be known from the header is checked here, before anything is
// written: the file type, every tensor's input type, the NextN tensors the
// header promises, the output layout.
func NewPlan(f *gguf.File, o Options) (*Plan, error) {
	if err := checkFileType(o.FileType); err != nil {
		return nil, err
	}
	if o.Imatrix != nil && o.ImatrixFile == "" {
		o.ImatrixFile = o.Imatrix.Path()
	}
	arch := f.Architecture()
	p := &Plan{Input: f.Path, Arch: arch, FileType: o.FileType, Options: o}
	m, err := quant.ModelFromKV(func(key string) (any, bool) {
		kv, ok := f.KV(key)
		if a, isArray := kv.Value.(gguf.Array); isArray {
			return a.Values, ok
		}
		return kv.Value, ok
	})
	if err != nil {
		return nil, &inputerr.Error{Path: f.Path, Offset: -1, Err: fmt.Errorf("%w: %w", ErrModel, err)}
	}
	p.Model = m
	p.MTPLayers = int(kvU32(f, arch+".nextn_predict_layers"))
	if err := checkMTP(f, arch, p.MTPLayers); err != nil {
		return nil, err
	}

	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		na, nb := f.Tensors[a].Name, f.Tensors[b].Name
		switch {
		case quant.LoaderLess(na, nb):
			return -1
		case quant.LoaderLess(nb, na):
			return 1
		}
		return 0
	})
	srcs := make([]quant.Source, len(order))
	for k, i := range order {
		t := f.Tensors[i]
		srcs[k] = quant.Source{Name: t.Name, Dims: slices.Clone(t.Dims), Type: t.Type}
	}
	if o.hasImatrix() {
		if err := o.Imatrix.Finite(); err != nil {
			return nil, err
		}
	}
	mtpFirst := int(p.Model.NLayerAll) - p.MTPLayers
	if o.MTPType != nil && p.MTPLayers == 0 && !slices.ContainsFunc(srcs, func(s quant.Source) bool { return strings.Contains(s.Name, ".nextn.") }) {
		return nil, fmt.Errorf("%s: %w: --mtp-type %s, but the model has no NextN/MTP layers (%s.nextn_predict_layers is not set)", f.Path, ErrMTPType, *o.MTPType, arch)
	}
	choices, err := quant.MixChoices(o.FileType, p.Model, srcs, quant.MixOptions{
		OutputType: o.OutputType, TokenEmbdType: o.TokenEmbdType, LeaveOutput: o.LeaveOutput, Pure: o.Pure,
		TensorTypes: o.TensorTypes, HasImatrix: o.hasImatrix(), MTPType: o.MTPType, MTPFirst: mtpFirst,
	})
	if err != nil {
		switch {
		case errors.Is(err, quant.ErrNeedsImatrix) && o.Imatrix != nil:
			err = fmt.Errorf("%w (%s needs one, and %s has no entries left after --include-weights/--exclude-weights)", err, o.FileType, o.ImatrixFile)
		case errors.Is(err, quant.ErrNeedsImatrix):
			err = fmt.Errorf("%w (%s needs --imatrix)", err, o.FileType)
		}
		return nil, errkind.Mark(errkind.Usage, fmt.Errorf("%s: %w", f.Path, err))
	}
	if len(choices) != len(srcs) {
		return nil, fmt.Errorf("%s: internal error: %d types for %d tensors", f.Path, len(choices), len(srcs))
	}
	var missing []string // need importance data the matrix lacks
	specs := make([]gguf.TensorSpec, len(order))
	for k, i := range order {
		in := f.Tensors[i]
		tp := TensorPlan{Name: in.Name, Dims: nDims(in.Dims), InType: in.Type, Type: choices[k].Type, By: choices[k].By, In: in}
		off := f.DataOffset + int64(in.Offset)
		if !tp.Copy() {
			if !decodable(in.Type) {
				return nil, inputerr.New(f.Path, in.Name, off, ErrInputType, "%s cannot be converted to %s", in.Type, tp.Type)
			}
			if in.Type.Quantized() && !o.AllowRequantize {
				return nil, inputerr.New(f.Path, in.Name, off, ErrRequantize, "%s, planned as %s", in.Type, tp.Type)
			}
			if !tp.Type.CanEncode() {
				return nil, fmt.Errorf("%s: tensor %q: %w", f.Path, in.Name, quant.ErrNoEncoder)
			}
			if o.hasImatrix() {
				if tp.Weights, err = weightsOf(o.Imatrix, in); err != nil {
					return nil, err
				}
				if tp.Weights == nil {
					p.Unweighted = append(p.Unweighted, in.Name)
					if quant.NeedsImatrix(o.FileType, in.Name, tp.Type) {
						missing = append(missing, in.Name)
					}
				}
			}
		}
		if _, ok := tp.Type.RowSize(ne0(in.Dims)); !ok {
			return nil, fmt.Errorf("%s: tensor %q: internal error: %s chosen for rows of %d values", f.Path, in.Name, tp.Type, ne0(in.Dims))
		}
		p.Tensors = append(p.Tensors, tp)
		specs[k] = gguf.TensorSpec{Name: tp.Name, Dims: tp.Dims, Type: tp.Type}
		p.InputBytes += in.Size()
	}
	if len(missing) > 0 {
		return nil, missingError(f.Path, &o, missing, mtpFirst)
	}
	p.KVs = outputKVs(f.KVs, o.FileType)
	if o.hasImatrix() {
		p.KVs = setKVs(p.KVs, o.Imatrix.KVs(o.ImatrixFile))
	}
	layout, err := gguf.PlanLayout(p.KVs, specs, f.Alignment)
	if err != nil {
		return nil, inputerr.Wrap(f.Path, err)
	}
	p.Layout = layout
	for i := range p.Tensors {
		p.Tensors[i].Bytes = layout.Tensors[i].Size()
	}
	if p.Layout, err = layout.WithSplit(p.KVs, o.Split); err != nil {
		return nil, err
	}
	return p, nil
}

// weightsOf is the importance vector of input tensor in, as llama-quantize
// picks it (imatrix.Matrix.Weights). A weighted tensor of more than three
// dimensions is refused: llama-quantize quantizes only its first ne2
// matrices, writing garbage after them.
func weightsOf(m *imatrix.Matrix, in gguf.TensorInfo) ([]float32, error) {
	w, err := m.Weights(in.Name, in.Dims)
	if err != nil || w == nil {
		return nil, err
	}
	for _, d := range in.Dims[min(len(in.Dims), 3):] {
		if d != 1 {
			return nil, fmt.Errorf("%s: tensor %q: %w: an importance vector for a %d-dimensional tensor", m.Path(), in.Name, ErrImatrix, len(in.Dims))
		}
	}
	return w, nil
}

// missingError is the refusal of a quantization whose matrix lacks entries
// for tensors whose type needs one (llama-quantize fails on the first, mid
// run: "Missing importance matrix for tensor … in a very low-bit
// quantization"): it lists them all, the MTP ones as such, and the ways
// out.
func missingError(path string, o *Options, missing []string, mtpFirst int) error {
	var mtp, other []string
	for _, n := range missing {
		if b, ok := blockNum(n); strings.Contains(n, ".nextn.") || (ok && b >= mtpFirst) {
			mtp = append(mtp, n)
		} else {
			other = append(other, n)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d tensors of this %s file need importance data (llama-quantize fails on the first, \"Missing importance matrix for tensor … in a very low-bit quantization\"), and %s has no entries for them:",
		path, len(missing), o.FileType, o.ImatrixFile)
	if len(mtp) > 0 {
		fmt.Fprintf(&b, "\n  MTP/NextN tensors (llama-imatrix does not run the MTP block): %s", strings.Join(mtp, ", "))
	}
	if len(other) > 0 {
		fmt.Fprintf(&b, "\n  %s", strings.Join(other, ", "))
	}
	b.WriteString("\nwhat to do:")
	if len(mtp) > 0 {
		b.WriteString(" keep the MTP block at a type that needs no matrix (--mtp-type Q8_0);")
	}
	if len(other) > 0 {
		b.WriteString(" give the other tensors a type that needs none (--tensor-type PATTERN=q4_k), or use a matrix computed on this model;")
	}
	b.WriteString(" or choose a file type that does not need one (Q2_K instead of Q2_K_S)")
	return fmt.Errorf("%w: %s", ErrImatrixMissing, b.String())
}

// blockNum is N of a "blk.N." name.
func blockNum(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	return n, err == nil
}

// setKVs sets each of kvs in list as gguf_set_val does: an existing pair of
// the same key is removed from its place, and the new one appended.
func setKVs(list, kvs []gguf.KV) []gguf.KV {
	for _, kv := range kvs {
		list = slices.DeleteFunc(list, func(x gguf.KV) bool { return x.Key == kv.Key })
		list = append(list, kv)
	}
	return list
}

// outputKVs is llama-quantize's KV section (§3.7): every input KV in order,
// split.* dropped, then general.quantization_version = 2 and
// general.file_type, each removed from its place and appended, so they end
// the list in that order.
func outputKVs(in []gguf.KV, f quant.FileType) []gguf.KV {
	var out []gguf.KV
	for _, kv := range in {
		if strings.HasPrefix(kv.Key, "split.") || kv.Key == "general.quantization_version" || kv.Key == "general.file_type" {
			continue
		}
		out = append(out, kv)
	}
	return append(out,
		gguf.KV{Key: "general.quantization_version", Type: gguf.ValueUint32, Value: uint32(2)},
		gguf.KV{Key: "general.file_type", Type: gguf.ValueUint32, Value: uint32(f)})
}

// nDims drops trailing dimensions of 1 (keeping at least one), as the C
// writer's ggml_n_dims does: gguf-py writes a (1, n) array as ne = [n, 1],
// llama-quantize rewrites it as [n].
func nDims(d []uint64) []uint64 {
	n := len(d)
	for n > 1 && d[n-1] == 1 {
		n--
	}
	return slices.Clone(d[:n])
}

func ne0(d []uint64) uint64 {
	if len(d) == 0 {
		return 1
	}
	return d[0]
}

// kvU32 reads an unsigned scalar metadata value, or 0.
func kvU32(f *gguf.File, key string) uint32 {
	kv, _ := f.KV(key)
	v, _ := kv.Uint()
	return uint32(v)
}

// nextnRequired are the NextN tensors llama.cpp requires of every MTP block
// (src/models/qwen35.cpp; the others are TENSOR_NOT_REQUIRED).
var nextnRequired = []string{"eh_proj.weight", "enorm.weight", "hnorm.weight"}

// checkMTP refuses a file whose header promises n NextN layers (the last n
// of block_count) without their required blk.N.nextn.* tensors:
// quantizing it would write a file whose MTP head llama.cpp cannot load.
func checkMTP(f *gguf.File, arch string, n int) error {
	if n <= 0 {
		return nil
	}
	blocks := int(kvU32(f, arch+".block_count"))
	key := arch + ".nextn_predict_layers"
	if n >= blocks {
		return &inputerr.Error{Path: f.Path, Key: key, Offset: -1, Err: fmt.Errorf("%w: %d NextN layers of %d blocks (%s.block_count counts them)", ErrMTPMissing, n, blocks, arch)}
	}
	var missing []string
	for b := blocks - n; b < blocks; b++ {
		for _, r := range nextnRequired {
			name := "blk." + strconv.Itoa(b) + ".nextn." + r
			if _, ok := f.Tensor(name); !ok {
				missing = append(missing, name)
			}
		}
	}
	if len(missing) > 0 {
		return &inputerr.Error{Path: f.Path, Key: key, Offset: -1, Err: fmt.Errorf("%w: %s = %d but the file has no %s (was the MTP head stripped without updating the header?)", ErrMTPMissing, key, n, strings.Join(missing, ", "))}
	}
	return nil
}
