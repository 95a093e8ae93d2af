package mlxpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// Options tune a repack.
type Options struct {
	// Rewrite writes new shards for the tensors that need MLX names
	// (needed for model types whose mlx-lm sanitize does not rename
	// weight_packed) and links every shard that needs no change.
	Rewrite bool
	// Relative makes the links relative (relocatable trees); absolute by
	// default.
	Relative bool
	// Force accepts a destination holding files repack did not make; they
	// are left in place and reported.
	Force bool
	// Jobs bounds how many shards --rewrite writes at once (each holds
	// about 6 MiB of buffers); below 1 means 1. Outputs do not depend on it.
	Jobs int
	// FollowExternalLinks accepts source files that are symlinks out of
	// the source directory (see safetensors.DirOptions).
	FollowExternalLinks bool
	// Progress, if set, is told the bytes of each rewritten shard once it
	// is written or found unchanged; it may be called from several
	// goroutines at once.
	Progress func(n int64)
}

// Mode names.
const (
	ModeLink    = "link"
	ModeRewrite = "rewrite"
)

// Module is one packed module of the source.
type Module struct {
	Name       string  `json:"name"`     // e.g. model.layers.1.mlp.experts.0.gate_proj
	MLXPath    string  `json:"mlx_path"` // the module path mlx-lm sees after sanitize
	Scheme     string  `json:"scheme"`   // config group
	Shape      []int64 `json:"shape"`    // weight_shape: the logical [..., out, in]
	ScaleDType string  `json:"scale_dtype"`
	Setting
}

// EntryKind is what a destination entry is; it marshals as its string.
type EntryKind string

// The entry kinds.
const (
	EntryLink   EntryKind = "link"   // a symlink to the source file
	EntryConfig EntryKind = "config" // config.json with the quantization block
	EntryShard  EntryKind = "shard"  // a rewritten shard
	EntryIndex  EntryKind = "index"  // model.safetensors.index.json for rewritten shards
)

// Entry is one planned name in the destination.
type Entry struct {
	Name   string    `json:"name"`
	Kind   EntryKind `json:"kind"`
	Source string    `json:"source,omitempty"` // absolute source path, for links
}

// outTensor is one tensor of a rewritten shard.
type outTensor struct {
	spec safetensors.TensorSpec
	from safetensors.Location
	// parts, when set, are the sources of a stacked tensor (one per
	// expert, in expert order), streamed one after another instead of from.
	parts []safetensors.Location
	bias  int // > 0: write −2^(bias−1)·source (scales → biases); 0: copy
}

// sources are the tensors whose bytes make t, in write order.
func (t outTensor) sources() []safetensors.Location {
	if t.parts != nil {
		return t.parts
	}
	return []safetensors.Location{t.from}
}

// shardPlan is one rewritten shard: its layout and where each tensor's
// bytes come from.
type shardPlan struct {
	outShard
	tensors []outTensor
}

// Plan is every decision of a repack, made from headers alone (plus the
// few bytes of each weight_shape tensor). It holds the source shards open:
// Close it.
type Plan struct {
	Src          string         `json:"src"`
	Mode         string         `json:"mode"`
	ModelType    string         `json:"model_type"`
	Quantization map[string]any `json:"quantization"`
	Global       Setting        `json:"global"`
	Modules      []Module       `json:"modules"`
	Entries      []Entry        `json:"entries"`
	Opts         Options        `json:"-"`

	config []byte // the new config.json
	index  []byte // the new index (rewrite of a sharded source)
	shards []shardPlan
	ckpt   *safetensors.Checkpoint
}

// Close releases the source files.
func (p *Plan) Close() error {
	if p == nil || p.ckpt == nil {
		return nil
	}
	return p.ckpt.Close()
}

// Config is the config.json the repack writes.
func (p *Plan) Config() []byte { return p.config }

// openSource opens the checkpoint directory src (arg names it in
// messages), refusing a file or a directory without config.json first.
func openSource(src, arg string, follow bool) (string, *safetensors.Checkpoint, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", nil, err
	}
	if st, err := os.Stat(abs); err != nil {
		return "", nil, err
	} else if !st.IsDir() {
		return "", nil, errf(abs, "", ErrNoConfig, "not a directory: %s takes a Hugging Face checkpoint directory", arg)
	}
	if _, err := os.Stat(filepath.Join(abs, "config.json")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", nil, errf(abs, "", ErrNoConfig, "a Hugging Face checkpoint directory needs one")
		}
		return "", nil, err
	}
	ckpt, err := safetensors.OpenDirOptions(abs, safetensors.DirOptions{FollowExternalLinks: follow})
	if err != nil {
		return "", nil, err
	}
	return abs, ckpt, nil
}

// maxShapeDims bounds what is read from a weight_shape tensor.
const maxShapeDims = 8

// PlanRepack reads src (config.json, the index, every shard header and the
// weight_shape tensors) and decides the whole repack; nothing is written.
// Every bad input is an *Error or a *safetensors.Error (BadInput).
func PlanRepack(src string, opts Options) (_ *Plan, err error) {
	abs, ckpt, err := openSource(src, "--src", opts.FollowExternalLinks)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(abs, "config.json")
	p := &Plan{Src: abs, ckpt: ckpt, Opts: opts}
	defer func() {
		if err != nil {
			ckpt.Close()
		}
	}()
	raw := ckpt.Config.Raw
	p.ModelType = ckpt.Config.ModelType
	qc, ok := quantizationConfig(raw)
	if !ok {
		if _, has := raw["quantization"]; has {
			return nil, errf(cfgPath, "", ErrNoQuantConfig, "it already has an MLX quantization block: the checkpoint is MLX already")
		}
		return nil, errf(cfgPath, "", ErrNoQuantConfig, "nothing to repack (for a float checkpoint use 'ferry mlx quantize')")
	}
	if _, has := raw["quantization"]; has {
		return nil, errf(cfgPath, "", ErrFormat, "it has both quantization_config and an MLX quantization block")
	}
	ct, err := ParseCTConfig(qc, cfgPath)
	if err != nil {
		return nil, err
	}
	if err := p.inventory(ct, cfgPath); err != nil {
		return nil, err
	}
	if err := p.decideMode(); err != nil {
		return nil, err
	}
	if err := p.quantBlock(cfgPath); err != nil {
		return nil, err
	}
	fixed, _ := FixedConfig(raw)
	order, err := configOrder(cfgPath)
	if err != nil {
		return nil, err
	}
	if p.config, err = mlxConfig(fixed, configEdit{quant: p.Quantization, order: order}); err != nil {
		return nil, err
	}
	if p.Mode == ModeRewrite {
		if err := p.planRewrite(); err != nil {
			return nil, err
		}
	}
	if err := p.planEntries(); err != nil {
		return nil, err
	}
	return p, nil
}

// packed-module tensor suffixes (compressed-tensors PackedQuantizationCompressor).
const (
	sfxPacked = ".weight_packed"
	sfxScale  = ".weight_scale"
	sfxShape  = ".weight_shape"
	sfxZP     = ".weight_zero_point"
	sfxGIdx   = ".weight_g_idx"
	sfxGlobal = ".weight_global_scale"
)

// inventory finds every packed module, checks it against the declaration
// and records its setting. The first inconsistency, in file order, is the
// error.
func (p *Plan) inventory(ct *CTConfig, cfgPath string) error {
	c := p.ckpt
	for _, l := range c.Tensors() {
		name := l.Info.Name
		path := l.Shard.Path
		for _, sfx := range []string{sfxPacked, sfxScale, sfxShape, sfxZP, sfxGIdx, sfxGlobal} {
			mod, ok := strings.CutSuffix(name, sfx)
			if !ok {
				continue
			}
			if _, packed := c.Lookup(mod + sfxPacked); !packed {
				return errf(path, name, ErrInconsistent, "no %s beside it", mod+sfxPacked)
			}
			switch sfx {
			case sfxZP:
				return errf(path, name, ErrAsymmetric, "zero points are stored")
			case sfxGIdx:
				return errf(path, name, ErrActOrder, "a group index per input column is stored")
			case sfxGlobal:
				return errf(path, name, ErrFormat, "a global scale (nvfp4 layout)")
			case sfxPacked:
				m, err := p.checkModule(ct, mod, l)
				if err != nil {
					return err
				}
				p.Modules = append(p.Modules, m)
			}
		}
	}
	if len(p.Modules) == 0 {
		return errf(cfgPath, "", ErrInconsistent, "quantization_config declares pack-quantized weights but no tensor is named *%s", sfxPacked)
	}
	return nil
}

func (p *Plan) checkModule(ct *CTConfig, mod string, packed safetensors.Location) (Module, error) {
	c := p.ckpt
	pPath := packed.Shard.Path
	if ig, ok := ct.Ignored(mod); ok {
		return Module{}, errf(pPath, packed.Info.Name, ErrInconsistent, "packed, but ignore entry %q says the module is not quantized", ig)
	}
	if w, ok := c.Lookup(mod + ".weight"); ok {
		return Module{}, errf(w.Shard.Path, w.Info.Name, ErrInconsistent, "a float weight beside %s", packed.Info.Name)
	}
	sch, err := ct.SchemeFor(mod)
	if err != nil {
		return Module{}, &Error{Path: pPath, Tensor: packed.Info.Name, Offset: -1, Err: err}
	}
	scale, ok := c.Lookup(mod + sfxScale)
	if !ok {
		return Module{}, errf(pPath, packed.Info.Name, ErrInconsistent, "no %s", mod+sfxScale)
	}
	shp, ok := c.Lookup(mod + sfxShape)
	if !ok {
		return Module{}, errf(pPath, packed.Info.Name, ErrInconsistent, "no %s", mod+sfxShape)
	}
	shape, err := readShape(shp)
	if err != nil {
		return Module{}, err
	}
	set := sch.Setting
	m := Module{Name: mod, Scheme: sch.Name, Shape: shape, ScaleDType: string(scale.Info.DType), Setting: set}
	nd := len(shape)
	lead, in := shape[:nd-1], shape[nd-1]
	pi := packed.Info
	if pi.DType != tensor.I32 {
		return Module{}, errf(pPath, pi.Name, ErrInconsistent, "dtype %s, want I32", pi.DType)
	}
	if in%int64(set.GroupSize) != 0 {
		return Module{}, errf(shp.Shard.Path, shp.Info.Name, ErrInconsistent, "weight_shape %v: input dim %d is not a multiple of group_size %d (%s)", shape, in, set.GroupSize, sch.Name)
	}
	wantPacked := append(append([]int64{}, lead...), in*int64(set.Bits)/32)
	if !slices.Equal(pi.Shape, wantPacked) {
		return Module{}, errf(pPath, pi.Name, ErrInconsistent, "shape %v, want %v for weight_shape %v at %s (%s)", pi.Shape, wantPacked, shape, set, sch.Name)
	}
	si := scale.Info
	if !si.DType.Convertible() || si.DType == tensor.F64 {
		return Module{}, errf(scale.Shard.Path, si.Name, ErrInconsistent, "dtype %s, want BF16, F16 or F32", si.DType)
	}
	wantScale := append(append([]int64{}, lead...), in/int64(set.GroupSize))
	if !slices.Equal(si.Shape, wantScale) {
		return Module{}, errf(scale.Shard.Path, si.Name, ErrInconsistent, "shape %v, want %v for weight_shape %v at %s (%s)", si.Shape, wantScale, shape, set, sch.Name)
	}
	paths, _ := mlxPaths(p.ModelType, mod)
	m.MLXPath = paths[0]
	return m, nil
}

// readShape reads a weight_shape tensor: 2 to 8 positive int64 (or int32)
// dimensions.
func readShape(l safetensors.Location) ([]int64, error) {
	t := l.Info
	bad := func(format string, args ...any) error {
		return errf(l.Shard.Path, t.Name, ErrInconsistent, format, args...)
	}
	if t.DType != tensor.I64 && t.DType != tensor.I32 {
		return nil, bad("dtype %s, want I64", t.DType)
	}
	if len(t.Shape) != 1 || t.Shape[0] < 2 || t.Shape[0] > maxShapeDims {
		return nil, bad("shape %v, want [2] (or up to [%d])", t.Shape, maxShapeDims)
	}
	buf := make([]byte, t.Size())
	if _, err := l.Section().ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", l.Shard.Path, t.Name, err)
	}
	width := t.DType.Bits() / 8
	shape := make([]int64, t.Shape[0])
	for i := range shape {
		if width == 8 {
			shape[i] = int64(binary.LittleEndian.Uint64(buf[8*i:]))
		} else {
			shape[i] = int64(int32(binary.LittleEndian.Uint32(buf[4*i:])))
		}
	}
	for _, d := range shape {
		if d <= 0 || d > 1<<40 {
			return nil, bad("values %v: dimension %d is not a positive size", shape, d)
		}
	}
	if _, err := tensor.NumElements(shape); err != nil {
		return nil, bad("values %v: %v", shape, err)
	}
	return shape, nil
}

// decideMode applies the model-type rule.
func (p *Plan) decideMode() error {
	cfgPath := p.ckpt.Config.Path
	if p.Opts.Rewrite {
		p.Mode = ModeRewrite
		if familyOf(p.ModelType).renamesPacked {
			return nil
		}
		for _, m := range p.Modules {
			switch {
			case familyOf(p.ModelType).stacksExperts && fusedExpertRE.MatchString(m.Name):
				return errf(cfgPath, m.Name+sfxPacked, errkind.ErrNotBuilt,
					"--rewrite of fused packed experts for model_type %q: mlx-lm splits a fused gate_up_proj .weight only, so its scales and biases would not load; splitting fused experts is not built", p.ModelType)
			case familyOf(p.ModelType).stacksExperts:
			case expertRE.MatchString(m.Name + "."):
				return errf(cfgPath, m.Name+sfxPacked, errkind.ErrNotBuilt,
					"--rewrite of per-expert packed modules for model_type %q: ferry stacks experts into switch_mlp only for %s, whose mlx-lm sanitize it knows; for this type it is not built", p.ModelType, familyTypes(func(f family) bool { return f.stacksExperts }))
			}
		}
		return nil
	}
	p.Mode = ModeLink
	if !familyOf(p.ModelType).renamesPacked {
		return errf(cfgPath, "", ErrNeedsRewrite,
			"model_type %q: mlx-lm renames weight_packed/weight_scale to weight/scales/biases only in the deepseek_v3 sanitize (%s); a symlink farm of this checkpoint would not load. Re-run with --rewrite to write MLX-named shards for the packed tensors and link the rest", p.ModelType, familyTypes(func(f family) bool { return f.renamesPacked }))
	}
	for _, m := range p.Modules {
		if m.Bits != 4 {
			return errf(cfgPath, m.Name+sfxPacked, ErrNeedsRewrite,
				"%d-bit: mlx-lm's deepseek_v3 sanitize sets biases = −8·scales, right for 4-bit only; re-run with --rewrite to write biases = −2^(bits−1)·scales", m.Bits)
		}
	}
	return nil
}

// quantBlock derives the MLX quantization block: the most common setting
// globally, per-layer overrides (keyed by mlx-lm module path) for the rest.
func (p *Plan) quantBlock(cfgPath string) error {
	type count struct {
		s Setting
		n int
	}
	bySetting := map[Setting]int{}
	byPath := map[string]Setting{}
	owner := map[string]string{}
	known := true
	for _, m := range p.Modules {
		paths, ok := mlxPaths(p.ModelType, m.Name)
		known = known && ok
		for _, path := range paths {
			if prev, seen := byPath[path]; seen {
				if prev != m.Setting {
					return errf(cfgPath, m.Name+sfxPacked, ErrMixed, "%s, but %s, stacked with it into %s, is %s", m.Setting, owner[path], path, prev)
				}
				continue
			}
			byPath[path] = m.Setting
			owner[path] = m.Name
			bySetting[m.Setting]++
		}
	}
	counts := make([]count, 0, len(bySetting))
	for s, n := range bySetting {
		counts = append(counts, count{s, n})
	}
	sort.Slice(counts, func(i, j int) bool {
		a, b := counts[i], counts[j]
		if a.n != b.n {
			return a.n > b.n
		}
		if a.s.Bits != b.s.Bits {
			return a.s.Bits < b.s.Bits
		}
		return a.s.GroupSize < b.s.GroupSize
	})
	p.Global = counts[0].s
	q := map[string]any{"group_size": p.Global.GroupSize, "bits": p.Global.Bits, "mode": "affine"}
	if len(counts) > 1 {
		if !known {
			return errf(cfgPath, "", ErrMixed, "settings %s and %s: MLX takes per-layer overrides keyed by the module path after mlx-lm's sanitize, which ferry knows only for %s", counts[0].s, counts[1].s, familyTypes(func(family) bool { return true }))
		}
		for path, s := range byPath {
			if s != p.Global {
				q[path] = map[string]any{"group_size": s.GroupSize, "bits": s.Bits}
			}
		}
	}
	p.Quantization = q
	return nil
}

// planRewrite lays out the new shards: every shard holding a packed-module
// tensor is rewritten in its own tensor order, weight_packed → weight (U32,
// same bytes), weight_scale → scales (same bytes) followed by biases,
// weight_shape dropped; other tensors copied. For model types whose mlx-lm
// sanitize stacks experts' .weight only (family.stacksExperts), the packed experts
// of each switch_mlp module are written stacked instead: weight, scales and
// biases [E, ...] in expert order, where the first expert's weight_packed
// (resp. weight_scale) was; the per-expert tensors are dropped from their
// shards.
func (p *Plan) planRewrite() error {
	mods := map[string]*Module{}
	for i := range p.Modules {
		mods[p.Modules[i].Name] = &p.Modules[i]
	}
	stacks, err := p.planStacks()
	if err != nil {
		return err
	}
	wm := map[string]string{}
	var total int64
	emitted := map[string]bool{}
	for _, sh := range p.ckpt.Shards {
		var tensors []outTensor
		touched := false
		for _, t := range sh.Tensors {
			l := safetensors.Location{Shard: sh, Info: t}
			spec := safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
			if mod, ok := strings.CutSuffix(t.Name, sfxPacked); ok && mods[mod] != nil {
				touched = true
				if st := stacks[mod]; st != nil {
					if !emitted[st.name+sfxPacked] {
						emitted[st.name+sfxPacked] = true
						tensors = append(tensors, outTensor{spec: st.spec(".weight", tensor.U32, t.Shape), parts: st.packed})
					}
					continue
				}
				spec.Name, spec.DType = mod+".weight", tensor.U32
				tensors = append(tensors, outTensor{spec: spec, from: l})
			} else if mod, ok := strings.CutSuffix(t.Name, sfxScale); ok && mods[mod] != nil {
				touched = true
				bits := mods[mod].Bits
				if st := stacks[mod]; st != nil {
					if !emitted[st.name+sfxScale] {
						emitted[st.name+sfxScale] = true
						tensors = append(tensors,
							outTensor{spec: st.spec(".scales", t.DType, t.Shape), parts: st.scale},
							outTensor{spec: st.spec(".biases", t.DType, t.Shape), parts: st.scale, bias: bits})
					}
					continue
				}
				spec.Name = mod + ".scales"
				tensors = append(tensors, outTensor{spec: spec, from: l})
				spec.Name = mod + ".biases"
				tensors = append(tensors, outTensor{spec: spec, from: l, bias: bits})
			} else if mod, ok := strings.CutSuffix(t.Name, sfxShape); ok && mods[mod] != nil {
				touched = true
			} else {
				tensors = append(tensors, outTensor{spec: spec, from: l})
			}
		}
		for _, t := range tensors {
			wm[t.spec.Name] = sh.Name
			total += t.spec.Size()
		}
		switch {
		case touched && len(tensors) == 0:
			// Only experts stacked into another shard: the file would be
			// empty (named by no index entry) or missing from the N-of-N
			// series; neither is a checkpoint ferry or Hugging Face reads.
			return errf(sh.Path, "", errkind.ErrNotBuilt, "every tensor of this shard is an expert stacked into a switch_mlp tensor written in an earlier shard; rebalancing shards so none is left empty is not built")
		case touched:
			specs := make([]safetensors.TensorSpec, len(tensors))
			for i, t := range tensors {
				specs[i] = t.spec
			}
			out, err := layoutShard(sh.Name, sh.Metadata, specs)
			if err != nil {
				return errf(sh.Path, "", ErrInconsistent, "rewritten with MLX names: %v", err)
			}
			p.shards = append(p.shards, shardPlan{outShard: out, tensors: tensors})
		}
	}
	if p.ckpt.Index == nil {
		return nil
	}
	md := map[string]any{}
	for k, v := range p.ckpt.Index.Metadata {
		md[k] = v
	}
	md["total_size"] = total
	p.index, err = indexJSON(md, wm, false)
	return err
}

// planEntries lists the destination: one link per source entry (hidden
// names skipped), except config.json (new) and, when rewriting, the
// rewritten shards and the index (new files).
func (p *Plan) planEntries() error {
	ents, err := os.ReadDir(p.Src)
	if err != nil {
		return err
	}
	rewritten := map[string]bool{}
	for _, s := range p.shards {
		rewritten[s.name] = true
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "."):
			continue
		case name == "config.json":
			p.Entries = append(p.Entries, Entry{Name: name, Kind: EntryConfig})
		case rewritten[name]:
			p.Entries = append(p.Entries, Entry{Name: name, Kind: EntryShard})
		case name == safetensors.IndexName && p.index != nil:
			p.Entries = append(p.Entries, Entry{Name: name, Kind: EntryIndex})
		default:
			p.Entries = append(p.Entries, Entry{Name: name, Kind: EntryLink, Source: filepath.Join(p.Src, name)})
		}
	}
	return nil
}

// expertStack is one switch_mlp module written stacked: its experts'
// weight_packed and weight_scale tensors in expert order.
type expertStack struct {
	name          string // checkpoint-style module name, e.g. model.layers.1.mlp.switch_mlp.up_proj
	packed, scale []safetensors.Location
}

// spec is the stacked tensor <name><suffix>: [E] + one expert's shape.
func (s *expertStack) spec(suffix string, dt tensor.DType, part []int64) safetensors.TensorSpec {
	shape := append([]int64{int64(len(s.packed))}, part...)
	return safetensors.TensorSpec{Name: s.name + suffix, DType: dt, Shape: shape}
}

// planStacks groups the packed experts of a model type whose family
// stacksExperts by
// switch_mlp module (keyed by each member's module name). A stack must hold
// experts 0…E−1, E the config's num_experts where it declares one, all
// with one setting, one weight_shape and one scale dtype; and no
// per-expert tensor that is not part of a packed expert may share the
// layer's experts (mlx-lm refuses mixed expert layouts).
func (p *Plan) planStacks() (map[string]*expertStack, error) {
	if !familyOf(p.ModelType).stacksExperts {
		return nil, nil
	}
	c := p.ckpt
	type member struct {
		e int
		m *Module
	}
	groups := map[string][]member{}
	var order []string
	for i := range p.Modules {
		m := &p.Modules[i]
		loc := expertRE.FindStringSubmatchIndex(m.Name + ".")
		if loc == nil {
			continue
		}
		e, err := strconv.Atoi(m.Name[loc[2]:loc[3]])
		if err != nil || e > 1<<20 {
			return nil, errf(c.Config.Path, m.Name+sfxPacked, ErrInconsistent, "expert index %q out of range", m.Name[loc[2]:loc[3]])
		}
		key := expertRE.ReplaceAllString(m.Name+".", ".switch_mlp.")
		key = key[:len(key)-1]
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], member{e, m})
	}
	prefixes := map[string]string{} // "<layer>.experts." → a stack in it
	packedExpert := map[string]bool{}
	for _, key := range order {
		layer, _, _ := strings.Cut(key, ".switch_mlp.")
		prefixes[layer+".experts."] = key
		for _, mb := range groups[key] {
			packedExpert[mb.m.Name] = true
		}
	}
	for _, l := range c.Tensors() {
		name := l.Info.Name
		loc := expertRE.FindStringIndex(name)
		if loc == nil {
			continue
		}
		key, ok := prefixes[name[:loc[0]]+".experts."]
		if !ok {
			continue
		}
		mod := name
		for _, sfx := range []string{sfxPacked, sfxScale, sfxShape} {
			mod = strings.TrimSuffix(mod, sfx)
		}
		if !packedExpert[mod] {
			return nil, errf(l.Shard.Path, name, ErrMixed, "per-expert tensor beside the packed experts stacked into %s: mlx-lm loads one expert layout per layer, and a stack of packed and float experts is not one", key)
		}
	}
	declared, hasDeclared := c.Config.Int("num_experts")
	out := map[string]*expertStack{}
	for _, key := range order {
		ms := groups[key]
		sort.Slice(ms, func(i, j int) bool { return ms[i].e < ms[j].e })
		first := ms[0].m
		st := &expertStack{name: key}
		for i, mb := range ms {
			m := mb.m
			if mb.e != i {
				return nil, errf(c.Config.Path, first.Name+sfxPacked, ErrInconsistent, "%s stacks experts 0…%d, but expert %d has no packed module", key, ms[len(ms)-1].e, i)
			}
			switch {
			case m.Setting != first.Setting:
				return nil, errf(c.Config.Path, m.Name+sfxPacked, ErrMixed, "%s, but %s, stacked with it into %s, is %s", m.Setting, first.Name, key, first.Setting)
			case !slices.Equal(m.Shape, first.Shape):
				return nil, errf(c.Config.Path, m.Name+sfxShape, ErrInconsistent, "weight_shape %v, but %s, stacked with it into %s, is %v", m.Shape, first.Name, key, first.Shape)
			case m.ScaleDType != first.ScaleDType:
				return nil, errf(c.Config.Path, m.Name+sfxScale, ErrInconsistent, "dtype %s, but %s, stacked with it into %s, has %s scales", m.ScaleDType, first.Name, key, first.ScaleDType)
			}
			pl, _ := c.Lookup(m.Name + sfxPacked)
			sl, _ := c.Lookup(m.Name + sfxScale)
			st.packed = append(st.packed, pl)
			st.scale = append(st.scale, sl)
		}
		if hasDeclared && int64(len(ms)) != declared {
			return nil, errf(c.Config.Path, first.Name+sfxPacked, ErrInconsistent, "%s stacks %d experts, but num_experts is %d", key, len(ms), declared)
		}
		for _, mb := range ms {
			out[mb.m.Name] = st
		}
	}
	return out, nil
}
