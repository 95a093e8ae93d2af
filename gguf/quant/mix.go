package quant

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/ferry-llm/ferry/internal/family"
)

// Model is what llama-quantize's type rules read of a model's hparams, as
// llama.cpp's loader fills them from a GGUF's KVs (src/llama-model.cpp,
// llama_model_base::load_hparams at 34af94c). ModelFromKV builds it.
//
//   - Arch: general.architecture (STRING).
//   - NHead: {arch}.attention.head_count, a UINT32, or an array of UINT32,
//     INT32 or BOOL with one value per block: the first block's value (the
//     rules use n_gqa() of layer 0). 0 when absent.
//   - NHeadKV: {arch}.attention.head_count_kv, likewise; NHead when absent.
//   - NExpert: {arch}.expert_count (UINT32), 0 when absent.
//   - NLayerAll: {arch}.block_count (UINT32, required), which counts the
//     NextN/MTP blocks too.
type Model struct {
	Arch      string
	NHead     uint32
	NHeadKV   uint32
	NExpert   uint32
	NLayerAll uint32
}

// maxLayers is LLAMA_MAX_LAYERS: the loader refuses a block_count outside
// 1…512.
const maxLayers = 512

// gqa is hparams.n_gqa(0): heads per KV head, 0 when there are no KV heads.
func (m Model) gqa() uint32 {
	if m.NHeadKV == 0 {
		return 0
	}
	return m.NHead / m.NHeadKV
}

// is70B is model.type == LLM_TYPE_70B, the one model size the rules read;
// which archs the loader gives that size, at which block_count, is the
// arch's family descriptor's (internal/family QuantRules: llama, deci,
// olmo and qwen2 at 80 blocks, llama only with grouped KV heads and not 8
// experts, jais2 at 68). None of these archs reads nextn_predict_layers,
// so their n_layer() is block_count.
func (m Model) is70B() bool {
	r := family.QuantRulesOf(m.Arch)
	if r.Blocks70B == 0 || m.NLayerAll != r.Blocks70B {
		return false
	}
	return !r.Llama70B || (m.NExpert != 8 && m.NHead != m.NHeadKV)
}

// Source is an input tensor as the rules see it: its name, its ggml dims
// (ne[0] first) and its current type.
type Source struct {
	Name string
	Dims []uint64
	Type Type
}

// ne is ggml's ne[i]: 1 past the recorded dims.
func (s Source) ne(i int) uint64 {
	if i < len(s.Dims) {
		return s.Dims[i]
	}
	return 1
}

// nDims is ggml_n_dims: trailing dims of 1 do not count, so a [n, 1]
// tensor is 1-D.
func (s Source) nDims() int {
	for i := len(s.Dims) - 1; i >= 1; i-- {
		if s.Dims[i] > 1 {
			return i + 1
		}
	}
	return 1
}

// MixOptions are llama-quantize's flags that change the choice.
type MixOptions struct {
	OutputType    *Type        // --output-tensor-type
	TokenEmbdType *Type        // --token-embedding-type
	LeaveOutput   bool         // --leave-output-tensor
	Pure          bool         // --pure
	TensorTypes   []TensorType // --tensor-type PATTERN=TYPE, in the order given
	// HasImatrix says an importance matrix will be used (--imatrix): it
	// allows Q2_K_S and takes the Q4_0/Q5_0 ffn_down rule.
	HasImatrix bool
	// MTPType, if set, is the type of every quantizable tensor of the
	// NextN/MTP blocks: blocks MTPFirst and up (block_count −
	// nextn_predict_layers) and any tensor whose name holds ".nextn.".
	// It is applied after the rules, so every other tensor's type (and
	// every counter) is what it is without it; the fallback still applies
	// (rows its blocks do not divide), and tensors never quantized (norms,
	// 1-D tensors) keep their input type. No llama-quantize flag does
	// this: it is ferry's --mtp-type.
	MTPType  *Type
	MTPFirst int
}

// Choice is one tensor's type as Mix chose it, and which option chose it.
type Choice struct {
	Type Type
	// By names the option that set the type ("--tensor-type PATTERN",
	// "--output-tensor-type", "--token-embedding-type",
	// "--leave-output-tensor", "--mtp-type"), "" when the type rules
	// (or --pure's default) did.
	By string
}

// TensorType is one --tensor-type override: the first whose Pattern
// matches anywhere in a tensor's name (llama-quantize lower-cases the
// pattern first, and so does Mix) gives that tensor Type, bypassing the
// mix rules but not the fallback. Patterns are Go regexps (RE2), which
// agree with llama-quantize's std::regex (ECMAScript) on plain names,
// classes, alternation and anchors; back-references and look-arounds are
// refused.
type TensorType struct {
	Pattern string
	Type    Type
}

// ErrNeedsImatrix is returned when a tensor's type needs an importance
// matrix and none is given (llama-quantize: "this quantization requires
// an imatrix!"): the Q2_K tensors of a Q2_K_S file.
var ErrNeedsImatrix = errors.New("this quantization requires an importance matrix")

// ErrUnsupportedFileType is returned for a file type llama-quantize makes
// and ferry does not: the IQ, TQ, MXFP4, NVFP4, Q1_0 and Q2_0 mixes.
var ErrUnsupportedFileType = errors.New("file type not supported")

// category is llama-quantize's tensor_category: substring tests on the
// name, first match wins (tensor_get_category).
type category uint8

const (
	catOther category = iota
	catOutput
	catTokenEmbd
	catAttnQKV
	catAttnKVB
	catAttnV
	catAttnK
	catAttnQ
	catAttnOutput
	catFFNUp
	catFFNGate
	catFFNDown
)

func categoryOf(name string) category {
	switch {
	case name == "output.weight":
		return catOutput
	case name == "token_embd.weight" || name == "per_layer_token_embd.weight":
		return catTokenEmbd
	}
	for _, c := range []struct {
		sub string
		cat category
	}{
		{"attn_qkv.weight", catAttnQKV}, {"attn_kv_b.weight", catAttnKVB}, {"attn_v.weight", catAttnV},
		{"attn_k.weight", catAttnK}, {"attn_q.weight", catAttnQ}, {"attn_output.weight", catAttnOutput},
		{"ffn_up", catFFNUp}, {"ffn_gate", catFFNGate}, {"ffn_down", catFFNDown},
	} {
		if strings.Contains(name, c.sub) {
			return c.cat
		}
	}
	return catOther
}

// attnVLike is category_is_attn_v: the tensors the attn_v rules and
// counters cover.
func (c category) attnVLike() bool { return c == catAttnV || c == catAttnQKV || c == catAttnKVB }

// notQuantized lists the name fragments tensor_allows_quantization refuses.
var notQuantized = []string{
	"_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
	"per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
	"indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
	"time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
	"time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
	"time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
	"time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd",
	"sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
	"mm.a.code_embd",
}

// allowsQuantization is tensor_allows_quantization (llamacpp.md §3.2): a
// tensor it refuses keeps its input type.
func allowsQuantization(s Source, o *MixOptions) bool {
	if s.nDims() < 2 {
		return false
	}
	n := s.Name
	// name.rfind("weight") == name.size() - 6 in size_t arithmetic: true
	// for a name ending in "weight", and also for any 5-byte name, where
	// size()-6 wraps to npos, the answer of a failed rfind.
	if !strings.HasSuffix(n, "weight") && len(n) != 5 {
		return false
	}
	if o.LeaveOutput && n == "output.weight" {
		return false
	}
	if n == "position_embd.weight" || n == "token_types.weight" {
		return false
	}
	for _, sub := range notQuantized {
		if strings.Contains(n, sub) {
			return false
		}
	}
	return true
}

// useMoreBits is llama-quantize's use_more_bits: the first and last eighth
// of the layers and every third one between get the bigger type. C's
// integer division and remainder truncate toward zero, as Go's do.
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// mixState is quantize_state_impl's counters.
type mixState struct {
	f        FileType
	m        Model
	o        *MixOptions
	tied     bool // no output.weight: token_embd is the output
	nAttnV   int  // attn_v-like tensors in the file
	nFFN     int  // n_ffn_down = n_ffn_gate = n_ffn_up = block_count
	iAttnV   int
	iFFNDown int
	iFFNGate int
	iFFNUp   int
	patterns []*regexp.Regexp
	by       string // the option that set the last typeOf's type
}

// Mix returns the type each tensor is written as, llama-quantize's choice
// at 34af94c (llama_tensor_get_type and
// llama_tensor_get_type_impl in src/llama-quant.cpp; llamacpp.md §3). ts
// must be in loader order (LoaderLess, strictly: no name twice), since the
// rules count tensors as they go. A returned type equal to the source's
// means the tensor is copied unchanged.
//
// Every rule for the supported file types is implemented, including those
// for the falcon arch, 8-expert models and 70B models. The IQ, TQ, MXFP4,
// NVFP4, Q1_0 and Q2_0 file types are refused (ErrUnsupportedFileType).
// Q2_K_S is refused without an importance matrix (ErrNeedsImatrix), as
// llama-quantize refuses it before writing anything. The NextN/MTP blocks
// count like any other: block_count includes them, and so do the attn_v
// and ffn_down counters.
func Mix(f FileType, m Model, ts []Source, o MixOptions) ([]Type, error) {
	cs, err := MixChoices(f, m, ts, o)
	if err != nil {
		return nil, err
	}
	out := make([]Type, len(cs))
	for i, c := range cs {
		out[i] = c.Type
	}
	return out, nil
}

// MixChoices is Mix, saying for each tensor which option, if any, set its
// type.
func MixChoices(f FileType, m Model, ts []Source, o MixOptions) ([]Choice, error) {
	def, ok := f.Default()
	if !ok {
		if name, known := unsupportedFileTypes[f]; known {
			return nil, fmt.Errorf("%s: %w", name, ErrUnsupportedFileType)
		}
		return nil, fmt.Errorf("%s: unknown file type", f)
	}
	// A CLIP file (an mmproj) has no block_count: llama-quantize runs its
	// rules with n_layer 0 (use_more_bits(i, 0) is true for every i).
	if (m.NLayerAll == 0 && !family.QuantRulesOf(m.Arch).NoHParams) || m.NLayerAll > maxLayers {
		return nil, fmt.Errorf("%s.block_count is %d: llama.cpp takes 1 to %d blocks", m.Arch, m.NLayerAll, maxLayers)
	}
	st := &mixState{f: f, m: m, o: &o, tied: true, nFFN: int(m.NLayerAll)}
	for _, tt := range o.TensorTypes {
		re, err := regexp.Compile(asciiLower(tt.Pattern))
		if err != nil {
			return nil, fmt.Errorf("tensor type override %q: %w", tt.Pattern, err)
		}
		st.patterns = append(st.patterns, re)
	}
	for i, s := range ts {
		if i > 0 && !LoaderLess(ts[i-1].Name, s.Name) {
			return nil, fmt.Errorf("tensor %q after %q: not in loader order", s.Name, ts[i-1].Name)
		}
		switch c := categoryOf(s.Name); {
		case c.attnVLike():
			st.nAttnV++
		case c == catOutput:
			st.tied = false
		}
	}
	out := make([]Choice, len(ts))
	for i, s := range ts {
		t, err := st.typeOf(s, def)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", s.Name, err)
		}
		c := Choice{Type: t, By: st.by}
		if o.MTPType != nil && allowsQuantization(s, &o) && isMTP(s.Name, o.MTPFirst) {
			if c.Type, err = fallback(s, *o.MTPType); err != nil {
				return nil, fmt.Errorf("tensor %q: --mtp-type: %w", s.Name, err)
			}
			c.By = "--mtp-type"
		}
		if !o.HasImatrix && allowsQuantization(s, &o) && NeedsImatrix(f, s.Name, c.Type) {
			return nil, fmt.Errorf("tensor %q as %s: %w", s.Name, c.Type, ErrNeedsImatrix)
		}
		out[i] = c
	}
	return out, nil
}

// isMTP reports whether tensor name belongs to a NextN/MTP block: block
// first or later, or a name holding ".nextn.".
func isMTP(name string, first int) bool {
	if strings.Contains(name, ".nextn.") {
		return true
	}
	b, ok := blockOf(name)
	return ok && int(b) >= first
}

// typeOf is llama_tensor_get_type: overrides, then the mix rules, then
// the fallback for rows the type's blocks do not divide.
func (st *mixState) typeOf(s Source, def Type) (Type, error) {
	st.by = ""
	if !allowsQuantization(s, st.o) {
		if st.o.LeaveOutput && s.Name == "output.weight" {
			st.by = "--leave-output-tensor"
		}
		return s.Type, nil
	}
	c := categoryOf(s.Name)
	if st.o.TokenEmbdType != nil && c == catTokenEmbd {
		st.by = "--token-embedding-type"
		return *st.o.TokenEmbdType, nil
	}
	if st.o.OutputType != nil && c == catOutput {
		st.by = "--output-tensor-type"
		return *st.o.OutputType, nil
	}
	t := def
	if !def.Quantized() { // F32, F16, BF16: every quantizable tensor gets it
		return t, nil
	}
	manual := false
	for i, re := range st.patterns {
		if re.MatchString(s.Name) {
			t, manual = st.o.TensorTypes[i].Type, true
			st.by = "--tensor-type " + st.o.TensorTypes[i].Pattern
			break
		}
	}
	if !manual && !st.o.Pure {
		var err error
		if t, err = st.rules(s, c, t); err != nil {
			return 0, err
		}
	}
	return fallback(s, t)
}

// fallback is tensor_type_fallback (llamacpp.md §3.6): the Fallback of
// t's row, F16 when that does not divide the row either.
func fallback(s Source, t Type) (Type, error) {
	ncols := s.ne(0)
	bs := uint64(t.BlockSize())
	if bs == 0 || ncols%bs == 0 {
		return t, nil
	}
	r := t.row().Fallback
	if r == F32 {
		return 0, fmt.Errorf("row of %d is not a whole number of %s blocks, and no tensor type fallback is defined for type %s", ncols, t, t)
	}
	if ncols%uint64(r.BlockSize()) != 0 {
		r = F16
	}
	return r, nil
}

// rules is llama_tensor_get_type_impl for the non-IQ file types: t is the
// file type's default. It advances the counters as llama-quantize does.
func (st *mixState) rules(s Source, c category, t Type) (Type, error) {
	f, m := st.f, st.m
	falcon := family.QuantRulesOf(m.Arch).Falcon
	switch {
	case c == catOutput || (st.tied && c == catTokenEmbd):
		switch {
		case st.o.OutputType != nil:
			st.by = "--output-tensor-type"
			return *st.o.OutputType, nil
		case falcon || s.ne(0)%uint64(t.BlockSize()) != 0:
			return Q8_0, nil
		case t != Q8_0:
			return Q6_K, nil
		}
		return t, nil
	case c == catTokenEmbd:
		// Untied: only the IQ, TQ and Q2_0 file types change it.
		return t, nil
	case c.attnVLike():
		gqa := m.gqa()
		switch {
		case f == FileQ2_K:
			t = Q3_K
			if gqa >= 4 {
				t = Q4_K
			}
		case f == FileQ2_K_S && gqa >= 4:
			t = Q4_K
		case f == FileQ3_K_M:
			t = Q4_K
			if st.iAttnV < 2 {
				t = Q5_K
			}
		case f == FileQ3_K_L:
			t = Q5_K
		case (f == FileQ4_K_M || f == FileQ5_K_M) && useMoreBits(st.iAttnV, st.nAttnV):
			t = Q6_K
		case f == FileQ4_K_S && st.iAttnV < 4:
			t = Q5_K
		}
		if m.is70B() && (t == Q3_K || t == Q4_K) {
			t = Q5_K
		}
		if m.NExpert == 8 {
			t = Q8_0
		}
		st.iAttnV++
		return t, nil
	case c == catAttnK:
		if m.NExpert == 8 {
			return Q8_0, nil
		}
		return t, nil
	case c == catAttnQ:
		return t, nil
	case c == catFFNDown:
		i, n, err := st.layer(st.iFFNDown, s.Name)
		if err != nil {
			return 0, err
		}
		st.iFFNDown++
		switch {
		case f == FileQ2_K:
			t = Q3_K
		case f == FileQ2_K_S:
			if i < n/8 {
				t = Q4_K
			}
		case f == FileQ3_K_M:
			switch {
			case i < n/16:
				t = Q5_K
			case !falcon || useMoreBits(i, n):
				t = Q4_K
			default:
				t = Q3_K
			}
		case f == FileQ3_K_L:
			t = Q5_K
			if falcon {
				t = Q4_K
			}
		case f == FileQ4_K_M:
			switch {
			case !falcon:
				if useMoreBits(i, n) {
					t = Q6_K
				}
			case i < n/16:
				t = Q6_K
			case useMoreBits(i, n):
				t = Q5_K
			default:
				t = Q4_K
			}
		case f == FileQ5_K_M && useMoreBits(i, n):
			t = Q6_K
		case f == FileQ4_K_S && !falcon && i < n/8:
			t = Q5_K
		case (f == FileQ4_0 || f == FileQ5_0) && st.o.HasImatrix && i < n/8:
			t = Q4_1
			if f == FileQ5_0 {
				t = Q5_1
			}
		}
		return t, nil
	case c == catAttnOutput:
		switch {
		case falcon:
			if f == FileQ3_K_L {
				t = Q4_K
			}
		case m.NExpert == 8:
			switch f {
			case FileQ2_K, FileQ3_K_S, FileQ3_K_M, FileQ4_K_S, FileQ4_K_M:
				t = Q5_K
			}
		default:
			switch f {
			case FileQ2_K:
				t = Q3_K
			case FileQ3_K_M:
				t = Q4_K
			case FileQ3_K_L:
				t = Q5_K
			}
		}
		return t, nil
	case c == catFFNGate:
		// No rule for these file types, but the layer is still checked.
		if _, _, err := st.layer(st.iFFNGate, s.Name); err != nil {
			return 0, err
		}
		st.iFFNGate++
		return t, nil
	case c == catFFNUp:
		if _, _, err := st.layer(st.iFFNUp, s.Name); err != nil {
			return 0, err
		}
		st.iFFNUp++
		return t, nil
	}
	// The ATTENTION_QKV branch of llama-quantize's chain comes after the
	// attn_v-like one, which takes every attn_qkv: it is never reached.
	return t, nil
}

// layer is layer_info: with experts, the layer is read from the name
// (the counter cannot be trusted when experts are split over tensors);
// without, it is the running counter. n is block_count either way.
func (st *mixState) layer(counter int, name string) (int, int, error) {
	n := st.nFFN
	if st.m.NExpert <= 1 {
		return counter, n, nil
	}
	l, ok := blockOf(name)
	if !ok {
		return 0, 0, fmt.Errorf("cannot read the layer from the name (%d experts)", st.m.NExpert)
	}
	if l < 0 || int(l) >= n {
		return 0, 0, fmt.Errorf("layer %d is not in [0, %d)", l, n)
	}
	return int(l), n, nil
}

// NeedsImatrix is tensor_requires_imatrix: whether llama-quantize refuses
// to write tensor name as type t in a file of type f without an
// importance matrix (and fails when the matrix has no entry for it). Of the supported file types only Q2_K_S needs one
// (for its Q2_K tensors); token_embd and output never do.
func NeedsImatrix(f FileType, name string, t Type) bool {
	if c := categoryOf(name); c == catOutput || c == catTokenEmbd {
		return false
	}
	switch t {
	case IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_M, IQ1_S:
		return true
	case Q2_K:
		return f == FileQ2_K_S
	}
	return false
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
