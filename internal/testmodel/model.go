package testmodel

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// DefaultMaxShardSize is the shard limit used when Common.MaxShardSize is 0:
// small enough that every default model has several shards and an index.
const DefaultMaxShardSize = 64 << 10

// Common holds the fields every family shares. A zero field takes the
// family's default (see each family's options type).
type Common struct {
	// Seed selects the values; the same options and seed give
	// byte-identical files.
	Seed uint64
	// DType of the weights: BF16 (default), F16 or F32.
	DType tensor.DType
	// MaxShardSize in bytes; tensors are packed greedily in state-dict
	// order as huggingface_hub does. 0 means DefaultMaxShardSize; a
	// negative value puts everything in one model.safetensors (no index).
	MaxShardSize int64

	VocabSize        int
	HiddenSize       int
	IntermediateSize int
	NumLayers        int
	NumHeads         int
	NumKVHeads       int
	HeadDim          int
	// TieWordEmbeddings omits lm_head.weight and sets tie_word_embeddings.
	TieWordEmbeddings bool

	// RepeatBlock > 0 makes every tensor repeat its first RepeatBlock values
	// (Values and the files agree). This is what makes multi-GB benchmark
	// checkpoints cheap to write; tiny test models leave it 0.
	RepeatBlock int64
	// DTypeOverrides stores tensors whose name ends with a key in that
	// dtype (BF16, F16 or F32) instead of DType, e.g. {"A_log": tensor.F32}
	// for a checkpoint with mixed dtypes.
	DTypeOverrides map[string]tensor.DType
	// NoTokenizer skips tokenizer.json and tokenizer_config.json. Without it
	// VocabSize must be at least 259 (256 byte symbols + 3 special tokens;
	// 270 with a vision tower).
	NoTokenizer bool

	// extraTokens are special tokens after the three ChatML ones (the
	// vision tokens), padRows embedding rows past the tokenizer's last
	// token; both shift the ids of the three ChatML tokens down.
	extraTokens []string
	padRows     int
}

func (c Common) withDefaults(d Common) Common {
	if c.DType == "" {
		c.DType = d.DType
	}
	if c.DType == "" {
		c.DType = tensor.BF16
	}
	if c.MaxShardSize == 0 {
		c.MaxShardSize = d.MaxShardSize
	}
	if c.MaxShardSize == 0 {
		c.MaxShardSize = DefaultMaxShardSize
	}
	def := func(v *int, dv int) {
		if *v == 0 {
			*v = dv
		}
	}
	def(&c.VocabSize, d.VocabSize)
	def(&c.HiddenSize, d.HiddenSize)
	def(&c.IntermediateSize, d.IntermediateSize)
	def(&c.NumLayers, d.NumLayers)
	def(&c.NumHeads, d.NumHeads)
	def(&c.NumKVHeads, d.NumKVHeads)
	def(&c.HeadDim, d.HeadDim)
	return c
}

func (c Common) check() error {
	switch c.DType {
	case tensor.BF16, tensor.F16, tensor.F32:
	default:
		return fmt.Errorf("testmodel: dtype %q not supported (BF16, F16, F32)", c.DType)
	}
	for _, v := range []struct {
		n string
		v int
	}{{"VocabSize", c.VocabSize}, {"HiddenSize", c.HiddenSize}, {"IntermediateSize", c.IntermediateSize},
		{"NumLayers", c.NumLayers}, {"NumHeads", c.NumHeads}, {"NumKVHeads", c.NumKVHeads}, {"HeadDim", c.HeadDim}} {
		if v.v <= 0 {
			return fmt.Errorf("testmodel: %s must be positive, got %d", v.n, v.v)
		}
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("testmodel: NumHeads %d is not a multiple of NumKVHeads %d", c.NumHeads, c.NumKVHeads)
	}
	for k, d := range c.DTypeOverrides {
		switch d {
		case tensor.BF16, tensor.F16, tensor.F32:
		default:
			return fmt.Errorf("testmodel: dtype override %q: %q not supported (BF16, F16, F32)", k, d)
		}
	}
	if need := minTokenizerVocab + c.reserved(); !c.NoTokenizer && c.VocabSize < need {
		return fmt.Errorf("testmodel: vocab_size %d is too small for the byte-level tokenizer (need >= %d, or set NoTokenizer)", c.VocabSize, need)
	}
	return nil
}

// Special token ids, as in the reference checkpoints: the last three ids of
// the vocabulary are <|endoftext|> (bos and pad), <|im_start|>, <|im_end|>
// (eos); with a vision tower the five vision tokens and three padding rows
// come after them (../shared/reference/qwen35vl: 509–511, 512–516, 520
// rows).
func (c Common) bosID() int { return c.VocabSize - 3 - c.reserved() }
func (c Common) eosID() int { return c.VocabSize - 1 - c.reserved() }

// reserved counts the ids after the three ChatML tokens.
func (c Common) reserved() int { return len(c.extraTokens) + c.padRows }

// Tensor is one tensor a generator wrote.
type Tensor struct {
	Name  string
	DType tensor.DType
	Shape []int64
	Init  Init
	Shard string // file name inside Model.Dir
}

// NumElements is the product of the shape.
func (t Tensor) NumElements() int64 {
	n, _ := tensor.NumElements(t.Shape)
	return n
}

// Size is the tensor's byte length.
func (t Tensor) Size() int64 {
	n, _ := tensor.ByteSize(t.DType, t.Shape)
	return n
}

// Model describes a checkpoint a generator wrote: enough for a test to
// assert against without reading the files back.
type Model struct {
	Dir          string
	Architecture string // architectures[0]
	ModelType    string // model_type of the text model
	// Config is config.json as written; TextConfig is the text model's
	// fields (the same map unless the layout nests a text_config).
	Config     map[string]any
	TextConfig map[string]any
	Seed       uint64
	DType      tensor.DType
	// RepeatBlock as in Common (0: no repetition).
	RepeatBlock int64
	// Prefix of the text model's tensors: "model." or, for the
	// ConditionalGeneration layout, "model.language_model.".
	Prefix string
	// NumLayers is num_hidden_layers; MTPLayers the MTP/NextN layer count the
	// config declares (mtp_num_hidden_layers or num_nextn_predict_layers).
	NumLayers int
	MTPLayers int
	// LayerTypes for hybrid models ("linear_attention" / "full_attention").
	LayerTypes []string
	// Tensors in state-dict order (the order shards were filled).
	Tensors []Tensor
	// Shards are the safetensors file names, in order.
	Shards []string
	// Files lists every file written, relative to Dir.
	Files []string

	index map[string]int
}

// Lookup returns the named tensor.
func (m *Model) Lookup(name string) (Tensor, bool) {
	i, ok := m.index[name]
	if !ok {
		return Tensor{}, false
	}
	return m.Tensors[i], true
}

// Names lists the tensor names in state-dict order.
func (m *Model) Names() []string {
	out := make([]string, len(m.Tensors))
	for i, t := range m.Tensors {
		out[i] = t.Name
	}
	return out
}

// MTPNames lists the MTP / NextN tensors (Qwen-style "mtp.*", or the
// DeepSeek-style extra layers model.layers.{N+i}.*), in state-dict order.
func (m *Model) MTPNames() []string {
	var out []string
	for _, t := range m.Tensors {
		if m.isMTP(t.Name) {
			out = append(out, t.Name)
		}
	}
	return out
}

func (m *Model) isMTP(name string) bool {
	if strings.HasPrefix(name, "mtp.") {
		return true
	}
	if rest, ok := strings.CutPrefix(name, m.Prefix+"layers."); ok {
		var l int
		if _, err := fmt.Sscanf(rest, "%d.", &l); err == nil && l >= m.NumLayers {
			return true
		}
	}
	return false
}

// TotalSize is the sum of all tensor byte lengths (the index's total_size).
func (m *Model) TotalSize() int64 {
	var n int64
	for _, t := range m.Tensors {
		n += t.Size()
	}
	return n
}

// TotalParameters is the sum of element counts.
func (m *Model) TotalParameters() int64 {
	var n int64
	for _, t := range m.Tensors {
		n += t.NumElements()
	}
	return n
}

// Values returns the named tensor's values exactly as stored (generated,
// then rounded through the tensor's dtype), as float32, in row-major order.
func (m *Model) Values(name string) ([]float32, error) {
	t, ok := m.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("testmodel: no tensor %q", name)
	}
	v := Values(m.Seed, t.Name, t.NumElements(), t.Init, m.RepeatBlock)
	return roundTrip(t.DType, v), nil
}

// Bytes returns the named tensor's stored bytes (what the shard holds).
func (m *Model) Bytes(name string) ([]byte, error) {
	t, ok := m.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("testmodel: no tensor %q", name)
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, newTensorReader(m.Seed, t, m.RepeatBlock)); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func roundTrip(d tensor.DType, v []float32) []float32 {
	if d == tensor.F32 {
		return v
	}
	buf := make([]byte, len(v)*d.Bits()/8)
	if err := tensor.FromF32(d, buf, v); err != nil {
		panic(err) // dtype checked when the model was built
	}
	if err := tensor.ToF32(d, v, buf); err != nil {
		panic(err)
	}
	return v
}

// builder collects a model's tensors and config, then writes them.
type builder struct {
	c          Common
	arch       string
	modelType  string
	prefix     string
	tensors    []Tensor // state-dict order, sharded greedily
	tail       []Tensor // appended to the last shard (MTP), as the reference does
	config     map[string]any
	text       map[string]any
	numLayers  int
	mtpLayers  int
	layerTypes []string
	// preprocessor, when set, is written as preprocessor_config.json;
	// visionConfig is the vision tower's config (Vision).
	preprocessor map[string]any
	visionConfig map[string]any
}

func (b *builder) dtype(name string) tensor.DType {
	keys := make([]string, 0, len(b.c.DTypeOverrides))
	for k := range b.c.DTypeOverrides {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic when several keys match
	for _, k := range keys {
		if strings.HasSuffix(name, k) {
			return b.c.DTypeOverrides[k]
		}
	}
	return b.c.DType
}

func (b *builder) add(name string, init Init, shape ...int64) {
	b.tensors = append(b.tensors, Tensor{Name: name, DType: b.dtype(name), Shape: shape, Init: init})
}

func (b *builder) addTail(name string, init Init, shape ...int64) {
	b.tail = append(b.tail, Tensor{Name: name, DType: b.dtype(name), Shape: shape, Init: init})
}

// Weight inits used across families, as in the reference data: matrices
// N(0, 0.02); 1-D norm weights at their transformers init (one, or zero for
// the zero-centred Qwen3.5 norms) plus N(0, 0.05) noise.
var (
	matInit  = NormalInit(0, 0.02)
	oneInit  = NormalInit(1, 0.05)
	zeroInit = NormalInit(0, 0.05)
)

// finish turns a builder into a Model: written into dir, or only laid out
// when dir is "".
func finish(dir string) func(*builder, error) (*Model, error) {
	return func(b *builder, err error) (*Model, error) {
		if err != nil {
			return nil, err
		}
		m, files, err := b.plan(dir)
		if err != nil || dir == "" {
			return m, err
		}
		return b.write(m, files)
	}
}

// plan lays the tensors out in shards; it reads and writes nothing.
func (b *builder) plan(dir string) (*Model, []safetensors.ShardFile, error) {
	all := append(append([]Tensor(nil), b.tensors...), b.tail...)
	seen := map[string]bool{}
	for _, t := range all {
		if seen[t.Name] {
			return nil, nil, fmt.Errorf("testmodel: duplicate tensor %q (generator bug)", t.Name)
		}
		seen[t.Name] = true
	}

	// Plan: greedy shards over the state-dict order, tail into the last.
	specs := make([]safetensors.TensorSpec, len(b.tensors))
	for i, t := range b.tensors {
		specs[i] = safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	var plan [][]safetensors.TensorSpec
	if b.c.MaxShardSize < 0 {
		plan = [][]safetensors.TensorSpec{specs}
	} else {
		plan = safetensors.PlanShards(specs, b.c.MaxShardSize)
	}
	for _, t := range b.tail {
		last := len(plan) - 1
		plan[last] = append(plan[last], safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape})
	}
	files := make([]safetensors.ShardFile, len(plan))
	shardOf := map[string]string{}
	for i, p := range plan {
		name := safetensors.SingleName
		if len(plan) > 1 {
			name = safetensors.ShardName(i+1, len(plan))
		}
		safetensors.SortReference(p)
		files[i] = safetensors.ShardFile{Name: name, Tensors: p}
		for _, s := range p {
			shardOf[s.Name] = name
		}
	}
	m := &Model{
		Dir: dir, Architecture: b.arch, ModelType: b.modelType, Config: b.config, TextConfig: b.text,
		Seed: b.c.Seed, DType: b.c.DType, RepeatBlock: b.c.RepeatBlock, Prefix: b.prefix,
		NumLayers: b.numLayers, MTPLayers: b.mtpLayers, LayerTypes: b.layerTypes,
		index: map[string]int{},
	}
	for _, t := range all {
		t.Shard = shardOf[t.Name]
		m.index[t.Name] = len(m.Tensors)
		m.Tensors = append(m.Tensors, t)
	}
	for _, f := range files {
		m.Shards = append(m.Shards, f.Name)
		m.Files = append(m.Files, f.Name)
	}
	if len(files) > 1 {
		m.Files = append(m.Files, safetensors.IndexName)
	}
	m.Files = append(m.Files, "config.json", "generation_config.json")
	if b.preprocessor != nil {
		m.Files = append(m.Files, "preprocessor_config.json")
	}
	if !b.c.NoTokenizer {
		m.Files = append(m.Files, "tokenizer.json", "tokenizer_config.json")
	}
	sort.Strings(m.Files)
	return m, files, nil
}

// write generates the planned files into m.Dir: shards (each atomic), the
// index, then config, generation config and tokenizer.
func (b *builder) write(m *Model, files []safetensors.ShardFile) (*Model, error) {
	dir := m.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	extra := map[string]any{"total_parameters": m.TotalParameters()}
	sw, err := safetensors.CreateShardedFiles(dir, map[string]string{"format": "pt"}, files, extra)
	if err != nil {
		return nil, fmt.Errorf("testmodel: %w", err)
	}
	for _, f := range files {
		for _, s := range f.Tensors {
			t, _ := m.Lookup(s.Name)
			if err := sw.WriteTensor(s.Name, newTensorReader(m.Seed, t, m.RepeatBlock)); err != nil {
				sw.Abort()
				return nil, fmt.Errorf("testmodel: %w", err)
			}
		}
	}
	if err := sw.Close(); err != nil {
		return nil, fmt.Errorf("testmodel: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), b.config); err != nil {
		return nil, err
	}
	gen := map[string]any{
		"_from_model_config": true, "bos_token_id": b.c.bosID(), "eos_token_id": b.c.eosID(),
		"output_attentions": false, "output_hidden_states": false, "pad_token_id": b.c.bosID(),
		"transformers_version": transformersVersion, "use_cache": true,
	}
	if err := writeJSON(filepath.Join(dir, "generation_config.json"), gen); err != nil {
		return nil, err
	}
	if !b.c.NoTokenizer {
		if err := writeTokenizer(dir, b.c); err != nil {
			return nil, err
		}
	}
	if b.preprocessor != nil {
		if err := writeJSON(filepath.Join(dir, "preprocessor_config.json"), b.preprocessor); err != nil {
			return nil, err
		}
	}
	return m, nil
}

const transformersVersion = "5.17.0"

// writeJSON writes v like json.dumps(indent=2, sort_keys=True) plus a
// newline, atomically.
func writeJSON(path string, v any) error {
	var b bytes.Buffer
	if err := jsonout.Write(&b, v); err != nil {
		return fmt.Errorf("testmodel: %s: %w", path, err)
	}
	return fsutil.WriteFileAtomic(path, b.Bytes(), 0o644)
}

// tensorReader streams a tensor's bytes without holding the whole tensor.
type tensorReader struct {
	d      tensor.DType
	g      *gen
	left   int64 // elements still to produce
	f32    []float32
	buf    []byte
	pend   []byte
	repeat []byte // whole-block bytes when RepeatBlock > 0
	rpos   int
	rleft  int64 // bytes left in repeat mode
}

const chunkElems = 1 << 14

func newTensorReader(seed uint64, t Tensor, block int64) io.Reader {
	n := t.NumElements()
	r := &tensorReader{d: t.DType, g: newGen(seed, t.Name, t.Init, block), left: n}
	if block > 0 && n > block {
		v := make([]float32, block)
		r.g.fill(v)
		r.repeat = make([]byte, block*int64(t.DType.Bits()/8))
		if err := tensor.FromF32(t.DType, r.repeat, v); err != nil {
			panic(err)
		}
		r.rleft = t.Size()
	}
	return r
}

func (r *tensorReader) Read(p []byte) (int, error) {
	if r.repeat != nil {
		if r.rleft == 0 {
			return 0, io.EOF
		}
		n := 0
		for len(p) > 0 && r.rleft > 0 {
			chunk := r.repeat[r.rpos:]
			if int64(len(chunk)) > r.rleft {
				chunk = chunk[:r.rleft]
			}
			c := copy(p, chunk)
			p = p[c:]
			n += c
			r.rleft -= int64(c)
			r.rpos = (r.rpos + c) % len(r.repeat)
		}
		return n, nil
	}
	if len(r.pend) == 0 {
		if r.left == 0 {
			return 0, io.EOF
		}
		k := int64(chunkElems)
		if k > r.left {
			k = r.left
		}
		if r.f32 == nil {
			r.f32 = make([]float32, chunkElems)
			r.buf = make([]byte, chunkElems*r.d.Bits()/8)
		}
		v := r.f32[:k]
		r.g.fill(v)
		b := r.buf[:k*int64(r.d.Bits()/8)]
		if err := tensor.FromF32(r.d, b, v); err != nil {
			return 0, err
		}
		r.left -= k
		r.pend = b
	}
	n := copy(p, r.pend)
	r.pend = r.pend[n:]
	return n, nil
}

// WriteTo lets io.Copy write whole chunks (or the repeated block) straight
// through, which keeps multi-GB generation at disk speed.
func (r *tensorReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if r.repeat != nil {
		for r.rleft > 0 {
			chunk := r.repeat[r.rpos:]
			if int64(len(chunk)) > r.rleft {
				chunk = chunk[:r.rleft]
			}
			n, err := w.Write(chunk)
			total += int64(n)
			r.rleft -= int64(n)
			r.rpos = (r.rpos + n) % len(r.repeat)
			if err != nil {
				return total, err
			}
		}
		return total, nil
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
