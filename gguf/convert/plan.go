package convert

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// TensorPlan is one output tensor: what is written and how it is made.
type TensorPlan struct {
	Name    string     // GGUF name
	Type    quant.Type // ggml type written
	Dims    []uint64   // ggml order (ne0 first)
	Sources []string   // checkpoint tensor names it is read from
	Steps   []string   // transforms applied, in order
	vt      *vtensor
}

// Plan is a complete, deterministic conversion plan. It holds no weight
// data; Write executes it.
type Plan struct {
	Dir      string // checkpoint directory
	HFArch   string // config.json architectures[0]
	Arch     string // GGUF general.architecture
	OutType  OutType
	FileType quant.FileType
	KVs      []gguf.KV
	Tensors  []TensorPlan
	Layout   *gguf.Layout
	// InputBytes is the number of checkpoint bytes the plan reads.
	InputBytes int64
	// MTPLayers is nextn_predict_layers as written (0 when none).
	MTPLayers int
	// MMProj: the plan writes the vision tower (Options.MMProj).
	MMProj bool
	// Warnings are the choices the converter made on a guess (e.g. an
	// unknown pre-tokenizer); the CLI prints them and --json lists them.
	Warnings []string
}

// model is the shared converter state: hparams, inventory, and the
// values every family reads.
type model struct {
	dir  string
	ckpt *safetensors.Checkpoint
	cfg  *safetensors.Config
	opts Options
	fam  family

	hfArch     string
	numHidden  int64 // num_hidden_layers (the trunk)
	blockCount int64 // block_count written (trunk + MTP when kept)
	nMTP       int64 // MTP layers kept
	mtpTensors int   // mtp.* tensors seen in the checkpoint
	ropeParams map[string]any
	outType    OutType
	inventory  []*invEntry
	autoDType  tensor.DType // dtype of the first ≥2-D BF16 or F16 tensor, for auto
	warnings   []string
}

// invEntry is a checkpoint tensor after the converter's name filters.
type invEntry struct {
	name string // filtered name (language_model. stripped, mtp.* renamed)
	src  *source
	shp  []int64
}

// hparam helpers over the merged (text_config laid over top-level) view.

func (m *model) has(key string) bool { _, ok := m.cfg.Get(key); return ok && !isNull(m.cfg, key) }

func isNull(c *safetensors.Config, key string) bool { v, _ := c.Get(key); return v == nil }

func (m *model) int(key string) (int64, bool) {
	if !m.has(key) {
		return 0, false
	}
	return m.cfg.Int(key)
}

func (m *model) mustInt(key string) (int64, error) {
	v, ok := m.int(key)
	if !ok {
		return 0, errf(m.cfg.Path, "", -1, ErrConfig, "%s is missing or not an integer", key)
	}
	return v, nil
}

func (m *model) float(key string) (float64, bool) {
	if !m.has(key) {
		return 0, false
	}
	return m.cfg.Float(key)
}

// findInt is find_hparam(keys, optional=True) for integers.
func (m *model) findInt(keys ...string) (int64, bool) {
	for _, k := range keys {
		if v, ok := m.cfg.Get(k); ok {
			if v == nil {
				return 0, false
			}
			return m.cfg.Int(k)
		}
	}
	return 0, false
}

func (m *model) findFloat(keys ...string) (float64, bool) {
	for _, k := range keys {
		if v, ok := m.cfg.Get(k); ok {
			if v == nil {
				return 0, false
			}
			return m.cfg.Float(k)
		}
	}
	return 0, false
}

func (m *model) cfgErr(format string, args ...any) error {
	return errf(m.cfg.Path, "", -1, ErrConfig, format, args...)
}

// ropeFloat reads a number from rope_parameters (with the top-level
// mirrors TextModel.__init__ applies).
func (m *model) ropeFloat(key string) (float64, bool) {
	v, ok := m.ropeParams[key]
	if !ok || v == nil {
		return 0, false
	}
	return jsonFloat(v)
}

func jsonFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	case float64:
		return n, true
	}
	return 0, false
}

func jsonInt(v any) (int64, bool) {
	switch n := v.(type) {
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case float64:
		return int64(n), float64(int64(n)) == n
	case int:
		return int64(n), true
	}
	return 0, false
}

// NewPlan plans the conversion of an opened checkpoint.
func NewPlan(ckpt *safetensors.Checkpoint, opts Options) (*Plan, error) {
	if opts.OutType == "" {
		opts.OutType = OutF16
	}
	switch opts.OutType {
	case OutF16, OutBF16, OutF32, OutQ8_0, OutAuto:
	default:
		return nil, errf(ckpt.Dir, "", -1, ErrOptions, "--outtype %q (want f16, bf16, f32, q8_0 or auto)", opts.OutType)
	}
	if opts.NoMTP && opts.MTPOnly {
		return nil, errf(ckpt.Dir, "", -1, ErrOptions, "--no-mtp and --mtp-only together")
	}
	if ckpt.Config == nil {
		return nil, errf(filepath.Join(ckpt.Dir, "config.json"), "", -1, ErrConfig, "no config.json in the checkpoint")
	}
	if opts.MMProj {
		p, err := newMMProjPlan(ckpt, opts)
		if err != nil {
			return nil, err
		}
		if p.Layout, err = p.Layout.WithSplit(p.KVs, opts.Split); err != nil {
			return nil, fmt.Errorf("%s: %w", ckpt.Dir, err)
		}
		return p, nil
	}
	arch := ckpt.Config.Architecture()
	fam, err := writerFor(arch)
	if err != nil {
		return nil, errf(ckpt.Config.Path, "", -1, ErrUnsupportedArch, "%v", err)
	}
	m := &model{dir: ckpt.Dir, ckpt: ckpt, cfg: ckpt.Config, opts: opts, fam: fam, hfArch: arch}
	if err := m.setup(); err != nil {
		return nil, err
	}
	p, err := m.plan()
	if err != nil {
		return nil, err
	}
	if p.Layout, err = p.Layout.WithSplit(p.KVs, opts.Split); err != nil {
		return nil, fmt.Errorf("%s: %w", ckpt.Dir, err)
	}
	return p, nil
}

// setup reads the common hparams and builds the inventory.
func (m *model) setup() error {
	n, ok := m.findInt("n_layers", "num_hidden_layers", "n_layer", "num_layers")
	if !ok || n <= 0 {
		return m.cfgErr("num_hidden_layers is missing or not a positive integer")
	}
	m.numHidden, m.blockCount = n, n

	// rope_parameters, with the global values mirrored in (TextModel.__init__).
	m.ropeParams = map[string]any{}
	rp, _ := m.cfg.Get("rope_parameters")
	if rp == nil {
		rp, _ = m.cfg.Get("rope_scaling")
	}
	if mp, ok := rp.(map[string]any); ok {
		for k, v := range mp {
			m.ropeParams[k] = v
		}
	}
	_, fa := m.ropeParams["full_attention"]
	_, sa := m.ropeParams["sliding_attention"]
	if !fa && !sa {
		firstOf := func(keys ...string) (any, bool) {
			for _, k := range keys {
				if v, ok := m.cfg.Get(k); ok {
					return v, v != nil
				}
			}
			return nil, false
		}
		if _, ok := m.ropeParams["rope_theta"]; !ok {
			if v, ok := firstOf("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"); ok {
				m.ropeParams["rope_theta"] = v
			}
		}
		if _, ok := m.ropeParams["rope_type"]; !ok {
			if v, ok := m.ropeParams["type"]; ok && v != nil {
				m.ropeParams["rope_type"] = v
			}
		}
		if _, ok := m.ropeParams["partial_rotary_factor"]; !ok {
			if v, ok := firstOf("partial_rotary_factor", "rope_pct", "rope_percent"); ok {
				m.ropeParams["partial_rotary_factor"] = v
			}
		}
		if _, ok := m.ropeParams["original_max_position_embeddings"]; !ok {
			if v, ok := firstOf("original_max_position_embeddings"); ok {
				m.ropeParams["original_max_position_embeddings"] = v
			}
		}
		if v, ok := firstOf("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"); ok {
			m.ropeParams["sliding_attention"] = map[string]any{"rope_theta": v}
		}
	}

	// Inventory: the converter's index order, its name filters.
	seen := map[string]string{}
	err := indexOrder(m.ckpt, func(sh *safetensors.Shard, ti safetensors.TensorInfo) error {
		if strings.HasPrefix(ti.Name, "mtp.") || strings.HasPrefix(ti.Name, "model.mtp.") {
			m.mtpTensors++
		}
		name, keep := filterName(ti.Name)
		if !keep {
			return nil
		}
		if f, ok := m.fam.(nameFilter); ok {
			if name, keep = f.filter(m, name); !keep {
				return nil
			}
		}
		e, err := newInvEntry(seen, sh, ti, name)
		if err != nil {
			return err
		}
		m.inventory = append(m.inventory, e)
		// --outtype auto: ModelBase.__init__ (34af94c) scans the tensors in
		// this order past 1-D ones and past any matrix that is neither
		// BF16 nor F16 (an F32 embedding, say); the first BF16 or F16
		// matrix decides, F16 when there is none.
		if m.autoDType == "" && len(ti.Shape) >= 2 && (ti.DType == tensor.BF16 || ti.DType == tensor.F16) {
			m.autoDType = ti.DType
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.outType = m.opts.OutType
	if m.outType == OutAuto {
		m.outType = OutF16
		if m.autoDType == tensor.BF16 {
			m.outType = OutBF16
		}
	}
	return m.fam.init(m)
}

// indexOrder visits the checkpoint's tensors in the order the converter
// indexes them (ModelBase.index_tensors with gguf-py's SafetensorsLocal):
// shard files by name, tensors by name within each.
func indexOrder(ck *safetensors.Checkpoint, visit func(sh *safetensors.Shard, ti safetensors.TensorInfo) error) error {
	shards := append([]*safetensors.Shard(nil), ck.Shards...)
	sort.Slice(shards, func(i, j int) bool { return shards[i].Name < shards[j].Name })
	for _, sh := range shards {
		infos := append([]safetensors.TensorInfo(nil), sh.Tensors...)
		sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
		for _, ti := range infos {
			if err := visit(sh, ti); err != nil {
				return err
			}
		}
	}
	return nil
}

// newInvEntry is checkpoint tensor ti of shard sh under its filtered name:
// refused when another tensor already took that name (seen maps filtered
// names to checkpoint names) or when its dtype does not convert.
func newInvEntry(seen map[string]string, sh *safetensors.Shard, ti safetensors.TensorInfo, name string) (*invEntry, error) {
	if prev, dup := seen[name]; dup {
		return nil, errf(sh.Path, ti.Name, sh.DataOffset()+ti.Begin, ErrUnknownTensor, "maps to %q like %q", name, prev)
	}
	seen[name] = ti.Name
	if !ti.DType.Convertible() {
		return nil, errf(sh.Path, ti.Name, sh.DataOffset()+ti.Begin, ErrUnknownTensor, "dtype %s (only F16, BF16, F32, F64 checkpoints convert; quantized checkpoints are not supported)", ti.DType)
	}
	src := &source{HFName: ti.Name, Loc: safetensors.Location{Shard: sh, Info: ti}, DType: ti.DType}
	return &invEntry{name: name, src: src, shp: ti.Shape}, nil
}

// nameFilter is implemented by families that rename or drop tensors at
// index time (the MTP mixin).
type nameFilter interface {
	filter(m *model, name string) (string, bool)
}

// filterName applies TextModel.filter_tensors and ModelBase.filter_tensors.
func filterName(name string) (string, bool) {
	for _, p := range []string{"mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.", "sound_projection.", "speech_embeddings."} {
		if strings.HasPrefix(name, p) {
			return "", false
		}
	}
	for _, s := range []string{"visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.", "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed", "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector."} {
		if strings.Contains(name, s) {
			return "", false
		}
	}
	if strings.HasSuffix(name, "e_score_correction_bias") {
		name = strings.Replace(name, "e_score_correction_bias", "e_score_correction.bias", 1)
	}
	name = strings.ReplaceAll(name, "language_model.", "")
	return name, true
}

// blockID is the first all-digit dot-separated part of name, or -1.
func blockID(name string) int {
	for _, p := range strings.Split(name, ".") {
		if p != "" && isDecimal(p) {
			n, err := strconv.Atoi(p)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

func isDecimal(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func (m *model) plan() (*Plan, error) {
	p := &Plan{Dir: m.dir, HFArch: m.hfArch, Arch: m.fam.arch(), OutType: m.outType, FileType: m.outType.fileType()}
	if err := m.mapInventory(p, func(vt *vtensor, bid int) ([]*vtensor, error) { return m.fam.modify(m, vt, bid) }); err != nil {
		return nil, err
	}
	if err := m.fam.finish(m); err != nil {
		return nil, err
	}
	if c, ok := m.fam.(checker); ok {
		if err := c.check(m, p.Tensors); err != nil {
			return nil, err
		}
	}
	var kv kvList
	if err := m.metadata(&kv, p.Tensors); err != nil {
		return nil, err
	}
	p.KVs = kv.list
	if n, ok := kv.get(p.Arch + ".nextn_predict_layers"); ok {
		p.MTPLayers = int(n.Value.(uint32))
	}
	if err := m.seal(p); err != nil {
		return nil, err
	}
	return p, nil
}

// mapInventory runs every inventory tensor but those the converter drops
// (ModelBase.prepare_tensors: attention masks and rotary inv_freq) through
// modify and appends the planned outputs to p.
func (m *model) mapInventory(p *Plan, modify func(vt *vtensor, bid int) ([]*vtensor, error)) error {
	for _, e := range m.inventory {
		if strings.HasSuffix(e.name, ".attention.masked_bias") || strings.HasSuffix(e.name, ".attention.bias") || strings.HasSuffix(e.name, ".rotary_emb.inv_freq") {
			continue
		}
		outs, err := modify(newSourceTensor(e.name, e.src, e.shp), blockID(e.name))
		if err != nil {
			return m.tensorErr(e.src, err)
		}
		for _, o := range outs {
			tp, err := m.outputTensor(o)
			if err != nil {
				return m.tensorErr(e.src, err)
			}
			p.Tensors = append(p.Tensors, tp)
		}
	}
	return nil
}

// seal completes a plan whose tensors and KVs are decided: the checkpoint
// bytes it reads, the warnings, the file layout.
func (m *model) seal(p *Plan) error {
	for _, l := range p.Tensors {
		for _, s := range l.vt.srcs {
			p.InputBytes += s.Loc.Info.Size()
		}
	}
	p.Warnings = m.warnings
	specs := make([]gguf.TensorSpec, len(p.Tensors))
	for i, t := range p.Tensors {
		specs[i] = gguf.TensorSpec{Name: t.Name, Dims: t.Dims, Type: t.Type}
	}
	layout, err := gguf.PlanLayout(p.KVs, specs, 0)
	if err != nil {
		return errf(m.dir, "", -1, ErrConfig, "%v", err)
	}
	p.Layout = layout
	return nil
}

// checker is implemented by families that check required tensors and
// shapes against the config once every output is known.
type checker interface {
	check(m *model, out []TensorPlan) error
}

func (m *model) tensorErr(s *source, err error) error {
	if _, ok := err.(*Error); ok {
		return err
	}
	return &Error{Path: s.Loc.Shard.Path, Tensor: s.HFName, Offset: s.Loc.Shard.DataOffset() + s.Loc.Info.Begin, Err: err}
}

// outputTensor plans one output tensor, its ggml type chosen by the
// options' policy.
func (m *model) outputTensor(v *vtensor) (TensorPlan, error) {
	if len(v.Name) >= gguf.MaxNameLen {
		return TensorPlan{}, fmt.Errorf("%w: GGUF name %q is %d bytes, the limit is %d", ErrUnknownTensor, v.Name, len(v.Name), gguf.MaxNameLen-1)
	}
	nd := len(v.Shape)
	if nd > gguf.MaxDims {
		return TensorPlan{}, fmt.Errorf("%w: %s has %d dims", ErrShape, v.Name, nd)
	}
	dims := make([]uint64, nd)
	for i, d := range v.Shape {
		dims[nd-1-i] = uint64(d)
	}
	policy := m.opts.Policy
	if policy == nil {
		policy = DefaultPolicy
	}
	want := m.outType.ggml()
	typ := policy(quant.Tensor{Name: v.Name, Dims: slices.Clone(dims)}, want)
	if !typ.CanEncode() {
		return TensorPlan{}, fmt.Errorf("%w: the type policy chose %s for %s (asked for %s); ferry cannot encode %s", ErrOptions, typ, v.Name, want, typ)
	}
	if _, ok := typ.RowSize(uint64(v.cols())); !ok {
		return TensorPlan{}, fmt.Errorf("%w: the type policy chose %s for %s, whose rows of %d values are not a whole number of %d-value blocks", ErrOptions, typ, v.Name, v.cols(), typ.BlockSize())
	}
	tp := TensorPlan{Name: v.Name, Type: typ, Dims: dims, Steps: v.desc, vt: v}
	for _, s := range v.srcs {
		tp.Sources = append(tp.Sources, s.HFName)
	}
	return tp, nil
}

// kvList keeps gguf-py's dict semantics: setting an existing key replaces
// the value in place.
type kvList struct {
	list []gguf.KV
	idx  map[string]int
}

func (l *kvList) add(kv gguf.KV) {
	if l.idx == nil {
		l.idx = map[string]int{}
	}
	if i, ok := l.idx[kv.Key]; ok {
		l.list[i] = kv
		return
	}
	l.idx[kv.Key] = len(l.list)
	l.list = append(l.list, kv)
}

func (l *kvList) get(key string) (gguf.KV, bool) {
	i, ok := l.idx[key]
	if !ok {
		return gguf.KV{}, false
	}
	return l.list[i], true
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
