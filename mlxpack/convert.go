package mlxpack

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/modulepaths"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// QuantizeOptions say what `ferry mlx quantize` makes of a checkpoint.
type QuantizeOptions struct {
	// Bits of the global affine setting; 0 converts without quantizing.
	Bits int
	// GroupSize of the global setting (default 64).
	GroupSize int
	// Recipe is one of mlx-lm's mixed recipes (mixed_2_6, mixed_3_4,
	// mixed_3_6, mixed_4_6), or "".
	Recipe string
	// ModuleBits are --module-bits overrides (PlanQuant applies them).
	ModuleBits []ModuleBits
	// DType casts every floating parameter (but those the family keeps,
	// A_log for Qwen3.5) before quantizing: "bf16", "f16", "f32", or ""
	// for mlx-lm's default (config torch_dtype, else text_config dtype,
	// else no cast).
	DType string
	// KeepMTP keeps the MTP head (quantized by the same rules) under the
	// names mlx-lm PR #990 loads, in side files mlx-lm's loader does not
	// read (modulepaths.MTPSideFile; config.json's MTPSideKey and the index
	// say where); by default it is dropped and the drop recorded in
	// config.json.
	KeepMTP bool
	// FollowExternalLinks: see safetensors.DirOptions.
	FollowExternalLinks bool
	// ShardSize is the most bytes of tensors one output shard holds
	// (default 5 GiB, mlx-lm's MAX_FILE_SIZE_GB).
	ShardSize int64
}

// DefaultShardSize is mlx-lm's MAX_FILE_SIZE_GB (5) << 30.
const DefaultShardSize int64 = 5 << 30

// TensorPlan is one output module (a quantized one writes weight, scales
// and biases).
type TensorPlan struct {
	Name      string       `json:"name"` // the MLX parameter, e.g. language_model.model.layers.0.mlp.up_proj.weight
	Source    []string     `json:"source"`
	Shape     []int64      `json:"shape"` // logical shape after sanitize
	DType     tensor.DType `json:"dtype"` // float dtype written (scales and biases too)
	Bits      int          `json:"bits,omitempty"`
	GroupSize int          `json:"group_size,omitempty"`
	Shift     bool         `json:"norm_shift,omitempty"`
	MTP       bool         `json:"mtp,omitempty"`
	Bytes     int64        `json:"bytes"` // output bytes (weight + scales + biases)

	src   *mlxTensor
	outs  []outRef // weight (and scales, biases)
	rows  int64
	cols  int64
	unit0 int // first unit index
	units int
}

// Module is the module path (Name without .weight).
func (t *TensorPlan) Module() string { return strings.TrimSuffix(t.Name, ".weight") }

// Quantized reports whether the module is written affine-quantized.
func (t *TensorPlan) Quantized() bool { return t.Bits > 0 }

// outRef is where an output tensor lives: shard and index in its layout.
type outRef struct{ shard, info int }

// QuantizePlan is every decision of an MLX conversion, made from headers
// alone. It holds the source open: Close it.
type QuantizePlan struct {
	Src          string          `json:"src"`
	ModelType    string          `json:"model_type"` // as mlx-lm loads it
	Quantization map[string]any  `json:"quantization,omitempty"`
	DType        tensor.DType    `json:"dtype,omitempty"` // cast target, "" for none
	ConfigFixes  []string        `json:"config_fixes,omitempty"`
	MTPDropped   []string        `json:"mtp_dropped,omitempty"`
	MTPKept      int             `json:"mtp_kept,omitempty"`
	Tensors      []*TensorPlan   `json:"tensors"`
	Files        []string        `json:"files"`
	Opts         QuantizeOptions `json:"-"`

	config, index, readme []byte
	copies                []string // source files copied as they are
	shards                []outShard
	units                 []unit
	ckpt                  *safetensors.Checkpoint
	stamp                 string
}

// Close releases the source files.
func (p *QuantizePlan) Close() error {
	if p == nil || p.ckpt == nil {
		return nil
	}
	return p.ckpt.Close()
}

// SourceBytes is what a run reads: the tensors it converts.
func (p *QuantizePlan) SourceBytes() int64 {
	return total(p.Tensors, func(t *TensorPlan) int64 { return t.src.size() })
}

// OutputBytes is the size of the shards written.
func (p *QuantizePlan) OutputBytes() int64 {
	return total(p.shards, func(s outShard) int64 { return s.size })
}

// total sums f over xs.
func total[T any](xs []T, f func(T) int64) int64 {
	var n int64
	for _, x := range xs {
		n += f(x)
	}
	return n
}

// MTPSideFiles lists the side files a kept MTP head is written to (none
// when it is dropped).
func (p *QuantizePlan) MTPSideFiles() []string {
	var out []string
	for _, s := range p.shards {
		if strings.HasPrefix(s.name, modulepaths.MTPSideStem) {
			out = append(out, s.name)
		}
	}
	return out
}

// Config is the config.json the conversion writes.
func (p *QuantizePlan) Config() []byte { return p.config }

var convertibleDTypes = map[tensor.DType]bool{tensor.BF16: true, tensor.F16: true, tensor.F32: true}

// cast targets by name: ferry's short names and mlx-lm's.
var dtypeNames = map[string]tensor.DType{
	"bf16": tensor.BF16, "bfloat16": tensor.BF16,
	"f16": tensor.F16, "float16": tensor.F16, "fp16": tensor.F16,
	"f32": tensor.F32, "float32": tensor.F32, "fp32": tensor.F32,
}

// PlanQuantize reads src's config, index and shard headers and decides the
// whole conversion; nothing is read from the tensors and nothing is
// written. Every bad input is an *Error or a *safetensors.Error.
func PlanQuantize(src string, opts QuantizeOptions) (_ *QuantizePlan, err error) {
	if err := checkQuantArgs(&opts); err != nil {
		return nil, err
	}
	abs, ckpt, err := openSource(src, "mlx quantize", opts.FollowExternalLinks)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(abs, "config.json")
	defer func() {
		if err != nil {
			ckpt.Close()
		}
	}()
	p := &QuantizePlan{Src: abs, ckpt: ckpt, Opts: opts}
	raw := ckpt.Config.Raw
	if what, ok := hasQuantization(raw); ok {
		return nil, errf(cfgPath, "", ErrQuantized, "it has %s: mlx quantize takes a float checkpoint (for compressed-tensors use 'ferry mlx repack')", what)
	}
	fixed, fixes := FixedConfig(raw)
	p.ConfigFixes = fixes
	p.ModelType, _ = fixed["model_type"].(string)
	fam, ok := convertFamilyOf(p.ModelType)
	if !ok {
		return nil, errf(cfgPath, "", ErrUnsupportedFamily, "model_type %q; supported: %s", ckpt.Config.ModelType, strings.Join(SupportedFamilies(), ", "))
	}
	if err := p.castTarget(fixed); err != nil {
		return nil, err
	}
	ws, err := p.inventory(cfgPath)
	if err != nil {
		return nil, err
	}
	ctx := &sanitizeCtx{cfg: ckpt.Config, keepMTP: opts.KeepMTP, cfgPath: cfgPath, mtpShift: true}
	ctx.tied, _ = ckpt.Config.Bool("tie_word_embeddings")
	ctx.layers, _ = ckpt.Config.Int("num_hidden_layers")
	ctx.experts, _ = ckpt.Config.Int("num_experts")
	if ctx.layers <= 0 || ctx.layers > 1<<16 {
		return nil, errf(cfgPath, "", ErrSanitize, "num_hidden_layers is missing or not a plausible count")
	}
	if ctx.experts < 0 || ctx.experts > 1<<16 {
		return nil, errf(cfgPath, "", ErrSanitize, "num_experts = %d is not a plausible count", ctx.experts)
	}
	if err := fam.sanitize(ctx, ws); err != nil {
		return nil, err
	}
	for _, n := range ws.names() {
		if strings.Contains(n, ".experts.") && !ws.m[n].mtp {
			return nil, errf(cfgPath, n, ErrSanitize, "left as it is by mlx-lm's %s sanitize, which its model then refuses at load (experts load as stacked switch_mlp tensors)", p.ModelType)
		}
	}
	p.MTPDropped = ctx.dropped
	if opts.KeepMTP && fam.mtpPrefix == "" {
		for _, n := range ws.names() {
			if ws.m[n].mtp {
				return nil, errf(cfgPath, n, errNotBuiltf("--keep-mtp for model_type %q", p.ModelType), "ferry knows where mlx-lm loads a kept MTP head only for qwen3_5 and qwen3_5_moe")
			}
		}
	}
	if err := p.planTensors(ws, fam); err != nil {
		return nil, err
	}
	block, err := p.decideQuant(ctx, cfgPath)
	if err != nil {
		return nil, err
	}
	if err := p.planShards(); err != nil {
		return nil, err
	}
	if err := p.planFiles(fixed, block); err != nil {
		return nil, err
	}
	p.planUnits()
	p.stamp = p.makeStamp()
	return p, nil
}

func errNotBuiltf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errkind.ErrNotBuilt}, args...)...)
}

func cutLast(name string) (string, string, bool) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return "", name, false
	}
	return name[:i], name[i+1:], true
}

func checkQuantArgs(o *QuantizeOptions) error {
	return errkind.Mark(errkind.Usage, checkArgs(o))
}

func checkArgs(o *QuantizeOptions) error {
	if o.GroupSize == 0 {
		o.GroupSize = 64
	}
	if o.ShardSize <= 0 {
		o.ShardSize = DefaultShardSize
	}
	if o.Bits == 0 {
		if o.Recipe != "" || len(o.ModuleBits) > 0 {
			return fmt.Errorf("%w: --recipe and --module-bits quantize: give --bits too", ErrQuantArgs)
		}
		return nil
	}
	if err := CheckAffine(o.Bits, o.GroupSize); err != nil {
		return fmt.Errorf("%w: %w", ErrQuantArgs, err)
	}
	if _, ok := QuantRecipes[o.Recipe]; !ok && o.Recipe != "" {
		return fmt.Errorf("%w: recipe %q (mlx-lm's are mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6)", ErrQuantArgs, o.Recipe)
	}
	return nil
}

// castTarget applies mlx-lm convert's dtype rule: --dtype, else
// config torch_dtype, else text_config dtype (a top-level "dtype" is not
// read); only float16, bfloat16 and float32 cast.
func (p *QuantizePlan) castTarget(cfg map[string]any) error {
	name := p.Opts.DType
	if name == "" {
		if s, ok := cfg["torch_dtype"].(string); ok {
			name = s
		} else if tc, ok := cfg["text_config"].(map[string]any); ok {
			name, _ = tc["dtype"].(string)
		}
		if name != "float16" && name != "bfloat16" && name != "float32" {
			return nil
		}
	}
	dt, ok := dtypeNames[strings.ToLower(name)]
	if !ok {
		return errkind.Mark(errkind.Usage, fmt.Errorf("%w: --dtype %q (bf16, f16 or f32)", ErrQuantArgs, name))
	}
	p.DType = dt
	return nil
}

// inventory loads every tensor name into the sanitize dict, refusing
// what cannot be converted.
func (p *QuantizePlan) inventory(cfgPath string) (*weightSet, error) {
	ws := &weightSet{m: map[string]*mlxTensor{}}
	for _, l := range p.ckpt.Tensors() {
		t := l.Info
		name := t.Name
		for _, sfx := range []string{sfxPacked, sfxScale, ".weight_scale_inv", ".qweight", ".scales", ".qzeros", ".biases"} {
			if strings.HasSuffix(name, sfx) {
				return nil, errf(l.Shard.Path, name, ErrQuantized, "a quantized tensor (*%s): mlx quantize takes a float checkpoint", sfx)
			}
		}
		if !convertibleDTypes[t.DType] {
			if strings.HasPrefix(string(t.DType), "F8_") {
				return nil, errf(l.Shard.Path, name, ErrQuantized, "dtype %s: an FP8 checkpoint; mlx quantize takes BF16, F16 or F32 weights", t.DType)
			}
			return nil, errf(l.Shard.Path, name, ErrUnsupportedDType, "dtype %s: mlx quantize converts BF16, F16 and F32 tensors", t.DType)
		}
		ws.put(&mlxTensor{name: name, dtype: t.DType, shape: append([]int64(nil), t.Shape...), spans: []span{whole(l)}})
	}
	if len(ws.m) == 0 {
		return nil, errf(cfgPath, "", ErrSanitize, "the checkpoint has no tensors")
	}
	return ws, nil
}

// planTensors orders the sanitized tensors as mlx-lm saves them and
// decides each one's dtype and quantization.
func (p *QuantizePlan) planTensors(ws *weightSet, fam convertFamily) error {
	names := ws.names()
	sortParams(names, fam.layerOrder)
	for _, n := range names {
		t := ws.m[n]
		tp := &TensorPlan{Name: n, Shape: t.shape, DType: t.dtype, Shift: t.shift, MTP: t.mtp, src: t}
		for _, s := range t.spans {
			if len(tp.Source) == 0 || tp.Source[len(tp.Source)-1] != s.srcName {
				tp.Source = append(tp.Source, s.srcName)
			}
		}
		if p.DType != "" && !desc.HasSuffix(n, fam.keepDType) {
			tp.DType = p.DType
		}
		if t.mtp {
			p.MTPKept++
		}
		tp.cols = 1
		if len(t.shape) > 0 {
			tp.cols = t.shape[len(t.shape)-1]
		}
		elems, err := tensor.NumElements(t.shape)
		if err != nil {
			return errf(p.Src, n, ErrSanitize, "shape %v: %v", t.shape, err)
		}
		if tp.cols > 0 {
			tp.rows = elems / tp.cols
		}
		p.Tensors = append(p.Tensors, tp)
	}
	return nil
}

// quantizable reports whether mlx-lm's module for the parameter has
// to_quantized: nn.Linear and nn.Embedding weights are 2-D, SwitchLinear
// (stacked experts) weights 3-D under switch_mlp; norms, Conv1d and bare
// parameters (A_log, dt_bias) are not.
func quantizable(t *TensorPlan) bool {
	if !strings.HasSuffix(t.Name, ".weight") {
		return false
	}
	switch len(t.Shape) {
	case 2:
		return !strings.Contains(t.Name, "conv1d")
	case 3:
		return strings.Contains(t.Name, ".switch_mlp.")
	}
	return false
}

// decideQuant asks PlanQuant what mlx_lm.convert -q does with each
// module and records it on the tensors; it returns the config block (nil
// when not quantizing).
func (p *QuantizePlan) decideQuant(ctx *sanitizeCtx, cfgPath string) (any, error) {
	o := p.Opts
	if o.Bits == 0 {
		return nil, nil
	}
	var mods []QuantModule
	var tps []*TensorPlan
	for _, t := range p.Tensors {
		if !strings.HasSuffix(t.Name, ".weight") {
			continue
		}
		mods = append(mods, QuantModule{Path: t.Module(), Quantizable: quantizable(t), Shape: t.Shape})
		tps = append(tps, t)
	}
	mt := p.ModelType
	if f, ok := desc.ByMLXModelType(mt); ok {
		mt = f.MLX.ModelType // mlx-lm's MODEL_REMAPPING: mistral is llama
	}
	qp, err := PlanQuant(mods, QuantOptions{ModelType: mt, Bits: o.Bits, GroupSize: o.GroupSize, Recipe: o.Recipe,
		NumLayers: int(ctx.layers), NumExperts: int(ctx.experts), ModuleBits: o.ModuleBits})
	if err != nil {
		return nil, &Error{Path: cfgPath, Offset: -1, Err: err}
	}
	for i, d := range qp.Modules {
		if d.Quantized {
			tps[i].Bits, tps[i].GroupSize = d.Bits, d.GroupSize
		}
	}
	block := qp.Block()
	b, err := json.Marshal(block)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(&p.Quantization); err != nil {
		return nil, err
	}
	return block, nil
}

// specs lists a tensor's output tensors: weight (U32 when quantized),
// then scales and biases.
func (t *TensorPlan) specs() []safetensors.TensorSpec {
	if !t.Quantized() {
		return []safetensors.TensorSpec{{Name: t.Name, DType: t.DType, Shape: t.Shape}}
	}
	mod := t.Module()
	lead := t.Shape[:len(t.Shape)-1]
	wq := append(append([]int64(nil), lead...), t.cols*int64(t.Bits)/32)
	sc := append(append([]int64(nil), lead...), t.cols/int64(t.GroupSize))
	return []safetensors.TensorSpec{
		{Name: mod + ".weight", DType: tensor.U32, Shape: wq},
		{Name: mod + ".scales", DType: t.DType, Shape: sc},
		{Name: mod + ".biases", DType: t.DType, Shape: sc},
	}
}

// planShards lays the parameters out, in order, in shards split as
// mlx-lm's make_shards splits them. A kept MTP head goes to side files of
// its own (splitMTPShards), after the trunk's shards: the trunk's are then
// byte for byte those of the same conversion without the head, which is
// all mlx-lm loads.
func (p *QuantizePlan) planShards() error {
	var trunk, head []*TensorPlan
	var trunkSpecs, headSpecs []safetensors.TensorSpec
	for _, t := range p.Tensors {
		if t.MTP {
			head = append(head, t)
			headSpecs = append(headSpecs, t.specs()...)
		} else {
			trunk = append(trunk, t)
			trunkSpecs = append(trunkSpecs, t.specs()...)
		}
	}
	var err error
	if p.shards, err = splitShards(trunkSpecs, p.Opts.ShardSize); err != nil {
		return errf(p.Src, "", ErrSanitize, "%v", err)
	}
	p.place(trunk, 0)
	if len(head) > 0 {
		side, err := splitMTPShards(headSpecs, p.Opts.ShardSize)
		if err != nil {
			return errf(p.Src, "", ErrSanitize, "%v", err)
		}
		first := len(p.shards)
		p.shards = append(p.shards, side...)
		p.place(head, first)
	}
	return nil
}

// place records where each output tensor of ts is: the shards from first
// on hold them in order (an empty shard, left by make_shards' split, is
// skipped).
func (p *QuantizePlan) place(ts []*TensorPlan, first int) {
	i, k := first, 0 // shard, tensor in it
	for _, t := range ts {
		for range t.specs() {
			for k == len(p.shards[i].specs) {
				i, k = i+1, 0
			}
			t.outs = append(t.outs, outRef{shard: i, info: k})
			t.Bytes += p.shards[i].specs[k].Size()
			k++
		}
	}
}

// files copied from the source as they are: what mlx-lm's tokenizer
// loading reads (mlx-lm re-saves the tokenizer; ferry copies it), the
// generation config, and remote code.
var copyPatterns = []string{
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
	"vocab.json", "merges.txt", "tokenizer.model", "tiktoken.model", "*.tiktoken",
	"chat_template.jinja", "chat_template.json", "generation_config.json", "*.py",
}

// readme is the model card mlx-lm's convert writes for a local source.
const readme = "---\nlanguage: en\nlibrary_name: mlx\npipeline_tag: text-generation\ntags:\n- mlx\n---\n"

func (p *QuantizePlan) planFiles(fixed map[string]any, block any) error {
	order, err := configOrder(filepath.Join(p.Src, "config.json"))
	if err != nil {
		return err
	}
	edit := configEdit{dropSaveKeys: true, quant: block, order: order}
	if len(p.MTPDropped) > 0 {
		edit.mtpDropped = p.ckpt.Config.MTPLayers()
		if edit.mtpDropped == 0 {
			edit.mtpDropped = 1
		}
		edit.mtpTensors = len(p.MTPDropped)
	}
	if p.MTPKept > 0 {
		side := &mtpSide{layers: max(p.ckpt.Config.MTPLayers(), 1), files: p.MTPSideFiles()}
		for _, s := range p.shards {
			if slices.Contains(side.files, s.name) {
				side.tensors += len(s.specs)
			}
		}
		edit.mtpSide = side
	}
	if gen, err := os.ReadFile(filepath.Join(p.Src, "generation_config.json")); err == nil && len(gen) < 1<<20 {
		var g map[string]any
		dec := json.NewDecoder(strings.NewReader(string(gen)))
		dec.UseNumber()
		if dec.Decode(&g) == nil && g["eos_token_id"] != nil {
			edit.eos = g["eos_token_id"]
		}
	}
	if p.config, err = mlxConfig(fixed, edit); err != nil {
		return err
	}
	p.readme = []byte(readme)
	ents, err := os.ReadDir(p.Src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !e.Type().IsRegular() && e.Type()&os.ModeSymlink == 0 {
			continue
		}
		for _, pat := range copyPatterns {
			if ok, _ := filepath.Match(pat, name); ok {
				p.copies = append(p.copies, name)
				break
			}
		}
	}
	// The index: total_size over every tensor, total_parameters as
	// mlx-lm's get_total_parameters counts them (a quantized weight as
	// size·32/bits), weight_map sorted, indent 4.
	wm := map[string]string{}
	var total, params int64
	modules := map[string]bool{} // module paths that hold submodules
	for _, t := range p.Tensors {
		parts := strings.Split(t.Name, ".")
		for k := 1; k < len(parts)-1; k++ {
			modules[strings.Join(parts[:k], ".")] = true
		}
	}
	for _, t := range p.Tensors {
		// get_total_parameters counts leaf modules' parameters only: a
		// parameter of a module with submodules (dt_bias, A_log of
		// linear_attn) is not counted.
		if mod, _, ok := cutLast(t.Name); !ok || !modules[mod] {
			n, _ := tensor.NumElements(t.Shape)
			params += n
		}
		for _, o := range t.outs {
			sh := p.shards[o.shard]
			wm[sh.specs[o.info].Name] = sh.name
			total += sh.specs[o.info].Size()
		}
	}
	if p.index, err = indexJSON(map[string]any{"total_size": total, "total_parameters": params}, wm, true); err != nil {
		return err
	}
	for _, s := range p.shards {
		p.Files = append(p.Files, s.name)
	}
	p.Files = append(p.Files, safetensors.IndexName, "config.json", "README.md")
	p.Files = append(p.Files, p.copies...)
	sort.Strings(p.Files)
	return nil
}

// makeStamp identifies the conversion for its resume journal: the whole
// layout, every decision, the source files (path, size, mtime).
func (p *QuantizePlan) makeStamp() string {
	h := sha256.New()
	fmt.Fprintf(h, "mlx quantize v1\x00%s\x00", p.config)
	for _, s := range p.shards {
		h.Write(s.hdr)
	}
	for _, t := range p.Tensors {
		fmt.Fprintf(h, "%s %s %d %d %v|", t.Name, t.DType, t.Bits, t.GroupSize, t.Shift)
		for _, s := range t.src.spans {
			fmt.Fprintf(h, "%s:%d+%d,", s.srcName, s.off, s.n)
		}
	}
	for _, s := range p.ckpt.Shards {
		var mt int64
		if st, err := os.Stat(s.Path); err == nil {
			mt = st.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "\x00%s\x00%d\x00%d", s.Path, s.Size, mt)
	}
	return hex.EncodeToString(h.Sum(nil))
}
