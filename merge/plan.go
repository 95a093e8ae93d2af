package merge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// PlanOptions tune Inventory.
type PlanOptions struct {
	// AllowUnused proceeds when some adapter tensors would not be used
	// (they are listed in Plan.Unused); by default that is an error.
	AllowUnused bool
	// DType is the dtype of the merged tensors (BF16, F16 or F32); "" keeps
	// each base tensor's own dtype. Untargeted tensors are always copied
	// verbatim.
	DType tensor.DType
	// FollowLinks reads files of the base and adapter directories that are
	// symlinks resolving outside them; by default they are refused (see
	// safetensors.DirOptions.FollowExternalLinks).
	FollowLinks bool
}

// Module kinds.
const (
	KindLinear    = "linear"
	KindEmbedding = "embedding"
)

// Module is one adapted base weight and how it is merged.
type Module struct {
	Name        string  `json:"name"`   // PEFT module path, without "base_model.model."
	Kind        string  `json:"kind"`   // KindLinear or KindEmbedding
	Target      string  `json:"target"` // base tensor name
	Rank        int     `json:"rank"`
	Alpha       float64 `json:"alpha"`
	Scaling     float64 `json:"scaling"`
	DoRA        bool    `json:"dora"`
	FanInFanOut bool    `json:"fan_in_fan_out,omitempty"`
	Rows        int64   `json:"rows"` // stored base shape
	Cols        int64   `json:"cols"`

	A         string `json:"lora_a"` // adapter tensor names
	B         string `json:"lora_b"`
	Magnitude string `json:"magnitude,omitempty"`
	LoraBias  string `json:"lora_bias,omitempty"`   // lora_B.bias
	BiasOf    string `json:"bias_target,omitempty"` // base bias the lora_B.bias is added to
}

// Op is what the merge does to one output tensor; it marshals as its
// string.
type Op string

// Tensor operations.
const (
	OpCopy    Op = "copy"    // bytes verbatim from the base
	OpMerge   Op = "merge"   // base weight + LoRA / DoRA
	OpBias    Op = "bias"    // base bias + s·lora_B.bias
	OpReplace Op = "replace" // full replacement from the adapter (modules_to_save, trained biases)
	OpConvert Op = "convert" // only the dtype changes (not produced today; reserved)
)

// TensorOp is one output tensor.
type TensorOp struct {
	Name     string       `json:"name"`
	Op       Op           `json:"op"`
	Module   int          `json:"module,omitempty"` // index into Plan.Modules for merge and bias
	Source   string       `json:"source,omitempty"` // adapter tensor for replace
	DType    tensor.DType `json:"dtype"`            // output dtype
	Shape    []int64      `json:"shape"`
	BaseSize int64        `json:"base_bytes"`
}

// ShardPlan is one output file: the base shard of the same name, rewritten
// when it holds an adapted tensor, otherwise copied as is.
type ShardPlan struct {
	Name    string     `json:"name"`
	Rewrite bool       `json:"rewrite"`
	Size    int64      `json:"base_bytes"` // the base shard's file size
	Tensors []TensorOp `json:"tensors"`
}

// Plan is every decision of a merge, made from headers and configs alone.
type Plan struct {
	BaseDir        string         `json:"base"`
	AdapterDir     string         `json:"adapter"`
	AdapterWeights string         `json:"adapter_weights"`
	DoRA           bool           `json:"dora"`
	RSLoRA         bool           `json:"rslora"`
	DType          tensor.DType   `json:"dtype,omitempty"`
	Modules        []Module       `json:"modules"`
	Shards         []ShardPlan    `json:"shards"`
	Single         bool           `json:"single_file"` // the base is one model.safetensors, no index
	AuxFiles       []string       `json:"aux_files"`   // copied verbatim (config, tokenizer, …)
	Unused         []string       `json:"unused,omitempty"`
	Warnings       []string       `json:"warnings,omitempty"`
	KeyRewrite     string         `json:"key_rewrite,omitempty"`
	TotalBytes     int64          `json:"total_bytes"` // base shard bytes read or copied
	IndexMeta      map[string]any `json:"-"`
	// Key digests the inputs (shard headers and sizes, adapter bytes,
	// config) and the options that change output bytes; a resume trusts
	// finished shards only under the same key.
	Key string `json:"key"`

	Config  *AdapterConfig          `json:"-"`
	base    *safetensors.Checkpoint `json:"-"`
	adapter *safetensors.File       `json:"-"`
}

// Close releases the base and adapter files the plan holds open.
func (p *Plan) Close() error {
	var first error
	if p.base != nil {
		first = p.base.Close()
	}
	if p.adapter != nil {
		if err := p.adapter.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// RewriteCount is the number of shards with adapted tensors.
func (p *Plan) RewriteCount() int {
	n := 0
	for _, s := range p.Shards {
		if s.Rewrite {
			n++
		}
	}
	return n
}

// adapter key suffixes (peft save_and_load; lora_magnitude_vector with or
// without ".weight": PEFT strips it, some exporters keep it).
const prefix = "base_model.model."

type role int

const (
	roleA role = iota
	roleB
	roleEmbA
	roleEmbB
	roleMag
	roleLoraBias
	roleBaseBias  // <M>.base_layer.bias: full replacement of <M>.bias
	roleFullParam // <M>.weight / <M>.bias: modules_to_save or bias="all"
)

var suffixes = []struct {
	s string
	r role
}{
	{".lora_A.weight", roleA},
	{".lora_B.weight", roleB},
	{".lora_B.bias", roleLoraBias},
	{".lora_embedding_A", roleEmbA},
	{".lora_embedding_B", roleEmbB},
	{".lora_magnitude_vector.weight", roleMag},
	{".lora_magnitude_vector", roleMag},
	{".base_layer.bias", roleBaseBias},
}

type modParts struct {
	name string
	keys map[role]string
}

// ParseDType parses the dtype merged tensors are written as, typed as
// tensor.ParseDType takes it: bf16, f16 or f32; "" keeps each base tensor's.
func ParseDType(s string) (tensor.DType, error) {
	if s == "" {
		return "", nil
	}
	if d, err := tensor.ParseDType(s); err == nil && outputDType(d) {
		return d, nil
	}
	return "", fmt.Errorf("want bf16, f16 or f32, got %q", s)
}

func outputDType(d tensor.DType) bool {
	switch d {
	case "", tensor.BF16, tensor.F16, tensor.F32:
		return true
	}
	return false
}

// Inventory reads the adapter config, the adapter and base headers and the
// base index (no weights) and builds the merge plan, checking everything a
// merge could trip over before a byte moves.
func Inventory(baseDir, adapterDir string, opt PlanOptions) (p *Plan, err error) {
	if !outputDType(opt.DType) {
		return nil, fmt.Errorf("%w: output dtype %s (want BF16, F16 or F32)", ErrUnsupported, opt.DType)
	}
	links := safetensors.DirOptions{FollowExternalLinks: opt.FollowLinks}
	if err := safetensors.CheckLinks(adapterDir, links); err != nil {
		return nil, err
	}
	cfg, err := ReadAdapterConfig(adapterDir)
	if err != nil {
		return nil, err
	}
	wpath, err := adapterWeightsPath(adapterDir)
	if err != nil {
		return nil, err
	}
	p = &Plan{BaseDir: baseDir, AdapterDir: adapterDir, AdapterWeights: wpath, Config: cfg,
		DoRA: cfg.UseDoRA, RSLoRA: cfg.UseRSLoRA, DType: opt.DType}
	opened := p // the named result is nil by the time an error return runs this
	defer func() {
		if err != nil {
			opened.Close()
		}
	}()
	if p.adapter, err = safetensors.Open(wpath); err != nil {
		return nil, err
	}
	if p.base, err = safetensors.OpenDirOptions(baseDir, links); err != nil {
		return nil, err
	}
	ad := p.adapter

	// Group adapter tensors by module.
	mods := map[string]*modParts{}
	var order []string
	var unused []string
	full := map[string]string{} // base-relative param name (M.weight / M.bias) → adapter key
	var fullOrder []string
	for _, t := range ad.Tensors {
		if !t.DType.Convertible() {
			return nil, inputErr(wpath, t.Name, ad.DataOffset()+t.Begin, ErrUnsupported, "adapter tensor of dtype %s", t.DType)
		}
		if !strings.HasPrefix(t.Name, prefix) {
			unused = append(unused, t.Name)
			continue
		}
		rest := t.Name[len(prefix):]
		matched := false
		for _, s := range suffixes {
			if strings.HasSuffix(rest, s.s) {
				m := strings.TrimSuffix(rest, s.s)
				mp := mods[m]
				if mp == nil {
					mp = &modParts{name: m, keys: map[role]string{}}
					mods[m] = mp
					order = append(order, m)
				}
				if _, dup := mp.keys[s.r]; dup {
					return nil, inputErr(wpath, t.Name, -1, ErrAdapterKey, "module %q has this tensor twice (with and without .weight?)", m)
				}
				mp.keys[s.r] = t.Name
				matched = true
				break
			}
		}
		if matched {
			continue
		}
		if strings.HasSuffix(rest, ".weight") || strings.HasSuffix(rest, ".bias") {
			full[rest] = t.Name
			fullOrder = append(fullOrder, rest)
			continue
		}
		unused = append(unused, t.Name)
	}

	// Key mapping: adapter module paths are runtime names; the checkpoint
	// may store the same tensors under a VLM layout.
	rewrite := newKeyMapper(p.base)
	lookup := func(name string) (safetensors.Location, string, bool) {
		for i, cand := range rewrite.candidates(name) {
			if l, ok := p.base.Lookup(cand); ok {
				if i > 0 {
					rewrite.usedPair = matchingPair(name, cand)
				}
				return l, cand, true
			}
		}
		return safetensors.Location{}, "", false
	}

	used := map[string]bool{} // base tensor → already claimed
	opOf := map[string]TensorOp{}
	claim := func(baseName, adapterKey string, op TensorOp) error {
		if used[baseName] {
			return inputErr(wpath, adapterKey, -1, ErrAdapterKey, "a second adapter entry targets base tensor %q", baseName)
		}
		used[baseName] = true
		opOf[baseName] = op
		return nil
	}
	outType := func(base tensor.DType) tensor.DType {
		if opt.DType != "" {
			return opt.DType
		}
		return base
	}
	var firstMismatch error
	mismatch := func(e error) {
		if firstMismatch == nil {
			firstMismatch = e
		}
	}

	kinds := &layerKinds{flag: cfg.FanInFanOut}
	if p.base.Config != nil {
		kinds.modelType = p.base.Config.ModelType
	}
	for _, m := range order {
		mp := mods[m]
		k := mp.keys
		_, hasA := k[roleA]
		_, hasB := k[roleB]
		_, hasEA := k[roleEmbA]
		_, hasEB := k[roleEmbB]
		isLinear, isEmb := hasA || hasB, hasEA || hasEB
		allKeys := func() []string {
			var out []string
			for _, v := range k {
				out = append(out, v)
			}
			sort.Strings(out)
			return out
		}
		if bb, ok := k[roleBaseBias]; ok {
			// A trained bias of a targeted module: a full replacement.
			delete(k, roleBaseBias)
			if cfg.Bias == "none" {
				unused = append(unused, bb)
			} else {
				full[m+".bias"] = bb
				fullOrder = append(fullOrder, m+".bias")
			}
		}
		if !isLinear && !isEmb {
			for _, v := range allKeys() {
				unused = append(unused, v)
			}
			continue
		}
		if !cfg.Targets(m) {
			for _, v := range allKeys() {
				unused = append(unused, v)
			}
			continue
		}
		if isLinear && isEmb {
			return nil, inputErr(wpath, k[roleA]+k[roleB], -1, ErrAdapterKey, "module %q has both Linear (lora_A/B) and Embedding (lora_embedding_A/B) factors", m)
		}
		aKey, bKey := k[roleA], k[roleB]
		kind := KindLinear
		if isEmb {
			aKey, bKey, kind = k[roleEmbA], k[roleEmbB], KindEmbedding
		}
		loc, target, ok := lookup(m + ".weight")
		if !ok {
			for _, v := range allKeys() {
				unused = append(unused, v)
			}
			p.Warnings = append(p.Warnings, fmt.Sprintf("module %s: no base tensor %s.weight", m, m))
			continue
		}
		if aKey == "" || bKey == "" {
			have := aKey + bKey
			return nil, inputErr(wpath, have, -1, ErrMissingFactor, "module %q has only one of its two LoRA factors", m)
		}
		if !loc.Info.DType.Convertible() || loc.Info.DType == tensor.F64 {
			return nil, inputErr(loc.Shard.Path, target, loc.Shard.DataOffset()+loc.Info.Begin, ErrUnsupported, "merging into a %s base tensor (want BF16, F16 or F32; quantized bases are not supported)", loc.Info.DType)
		}
		if len(loc.Info.Shape) != 2 {
			return nil, inputErr(loc.Shard.Path, target, loc.Shard.DataOffset()+loc.Info.Begin, ErrUnsupported, "base tensor has shape %v; only 2-D Linear and Embedding weights can be merged (no Conv)", loc.Info.Shape)
		}
		at, _ := ad.Tensor(aKey)
		bt, _ := ad.Tensor(bKey)
		r, alpha, scaling := cfg.RankAlpha(m)
		mod := Module{Name: m, Kind: kind, Target: target, Rank: r, Alpha: alpha, Scaling: scaling,
			DoRA: cfg.UseDoRA, Rows: loc.Info.Shape[0], Cols: loc.Info.Shape[1], A: aKey, B: bKey}
		if kind == KindLinear {
			mod.FanInFanOut = kinds.fanInFanOut(m, at.Shape, bt.Shape, mod.Rows, mod.Cols)
		}
		// Expected factor shapes. Linear: A (r,in), B (out,r), W (out,in),
		// or (in,out) with fan_in_fan_out. Embedding: A (r,vocab),
		// B (dim,r), W (vocab,dim).
		var inDim, outDim int64 // A's columns and B's rows
		switch {
		case kind == KindEmbedding, mod.FanInFanOut:
			inDim, outDim = mod.Rows, mod.Cols
		default:
			inDim, outDim = mod.Cols, mod.Rows
		}
		if len(at.Shape) != 2 || len(bt.Shape) != 2 {
			return nil, inputErr(wpath, aKey, -1, ErrShapeMismatch, "LoRA factors of shapes %v and %v are not matrices", at.Shape, bt.Shape)
		}
		if at.Shape[0] != bt.Shape[1] {
			return nil, inputErr(wpath, bKey, ad.DataOffset()+bt.Begin, ErrShapeMismatch, "B is %v but A is %v: the ranks differ", bt.Shape, at.Shape)
		}
		if int(at.Shape[0]) != r {
			return nil, inputErr(wpath, aKey, ad.DataOffset()+at.Begin, ErrRankMismatch, "A has %d rows but the config gives module %q rank %d", at.Shape[0], m, r)
		}
		if at.Shape[1] != inDim {
			mismatch(inputErr(wpath, aKey, ad.DataOffset()+at.Begin, ErrShapeMismatch, "A is %v, so the module has %d inputs, but base tensor %q is %v (%d inputs); first mismatch", at.Shape, at.Shape[1], target, loc.Info.Shape, inDim))
			continue
		}
		if bt.Shape[0] != outDim {
			mismatch(inputErr(wpath, bKey, ad.DataOffset()+bt.Begin, ErrShapeMismatch, "B is %v, so the module has %d outputs, but base tensor %q is %v (%d outputs); first mismatch", bt.Shape, bt.Shape[0], target, loc.Info.Shape, outDim))
			continue
		}
		if mag, ok := k[roleMag]; ok {
			if !cfg.UseDoRA {
				unused = append(unused, mag)
			} else {
				mt, _ := ad.Tensor(mag)
				if numel(mt.Shape) != outDim || len(mt.Shape) != 1 && !(len(mt.Shape) == 2 && (mt.Shape[0] == 1 || mt.Shape[1] == 1)) {
					mismatch(inputErr(wpath, mag, ad.DataOffset()+mt.Begin, ErrShapeMismatch, "magnitude is %v, want [%d] for base tensor %q %v; first mismatch", mt.Shape, outDim, target, loc.Info.Shape))
					continue
				}
				mod.Magnitude = mag
			}
		} else if cfg.UseDoRA {
			return nil, inputErr(wpath, aKey, -1, ErrMissingMagnitude, "module %q has no %s%s.lora_magnitude_vector", m, prefix, m)
		}
		if lb, ok := k[roleLoraBias]; ok {
			if !cfg.LoraBias || kind != KindLinear {
				unused = append(unused, lb)
			} else {
				bl, bname, ok := lookup(m + ".bias")
				if !ok {
					return nil, inputErr(wpath, lb, -1, ErrNoBaseTensor, "lora_B.bias needs a base bias %s.bias, which the base does not have (PEFT refuses this merge too)", m)
				}
				lbt, _ := ad.Tensor(lb)
				if numel(lbt.Shape) != outDim || numel(bl.Info.Shape) != outDim || !bl.Info.DType.Convertible() {
					mismatch(inputErr(wpath, lb, ad.DataOffset()+lbt.Begin, ErrShapeMismatch, "lora_B.bias is %v and base bias %q is %s %v, want %d elements; first mismatch", lbt.Shape, bname, bl.Info.DType, bl.Info.Shape, outDim))
					continue
				}
				mod.LoraBias, mod.BiasOf = lb, bname
			}
		}
		idx := len(p.Modules)
		p.Modules = append(p.Modules, mod)
		if err := claim(target, aKey, TensorOp{Name: target, Op: OpMerge, Module: idx, DType: outType(loc.Info.DType), Shape: loc.Info.Shape}); err != nil {
			return nil, err
		}
		if mod.LoraBias != "" {
			bl, _ := p.base.Lookup(mod.BiasOf)
			if err := claim(mod.BiasOf, mod.LoraBias, TensorOp{Name: mod.BiasOf, Op: OpBias, Module: idx, DType: outType(bl.Info.DType), Shape: bl.Info.Shape}); err != nil {
				return nil, err
			}
		}
	}
	p.Warnings = append(p.Warnings, kinds.warnings()...)
	if firstMismatch != nil {
		return nil, firstMismatch
	}

	// Full replacements: modules_to_save parameters and trained biases.
	for _, rel := range fullOrder {
		key := full[rel]
		m := rel[:strings.LastIndex(rel, ".")]
		isBias := strings.HasSuffix(rel, ".bias")
		allowed := cfg.SavesModule(m) || (isBias && cfg.Bias != "none")
		if !allowed {
			unused = append(unused, key)
			continue
		}
		loc, bname, ok := lookup(rel)
		if !ok {
			unused = append(unused, key)
			p.Warnings = append(p.Warnings, fmt.Sprintf("%s: no base tensor %s", key, rel))
			continue
		}
		at, _ := ad.Tensor(key)
		if !equalShape(at.Shape, loc.Info.Shape) || !loc.Info.DType.Convertible() {
			return nil, inputErr(wpath, key, ad.DataOffset()+at.Begin, ErrShapeMismatch, "replacement is %s %v but base tensor %q is %s %v", at.DType, at.Shape, bname, loc.Info.DType, loc.Info.Shape)
		}
		if err := claim(bname, key, TensorOp{Name: bname, Op: OpReplace, Module: -1, Source: key, DType: outType(loc.Info.DType), Shape: loc.Info.Shape}); err != nil {
			return nil, err
		}
	}

	sort.Strings(unused)
	p.Unused = unused
	if len(p.Modules) == 0 && len(opOf) == 0 {
		return nil, inputErr(wpath, "", -1, ErrNothingToMerge, "none of its %d tensors maps to a tensor of %s (adapter for another model?); unused: %s", len(ad.Tensors), baseDir, listSome(unused, 8))
	}
	if len(unused) > 0 && !opt.AllowUnused {
		return nil, inputErr(wpath, "", -1, ErrUnusedTensors, "%d tensors would be ignored (not targeted by adapter_config.json, unknown, or without a base tensor); pass --allow-unused to merge anyway: %s", len(unused), listSome(unused, 20))
	}

	// Config-targeted 2-D weights with no adapter weights are reported.
	// The MTP head is the expected case: transformers drops mtp.* on load,
	// so PEFT never wraps those modules even when target_modules matches
	// them (the bundled qwen35-tiny DoRA adapter, like any adapter naming
	// q_proj … down_proj, matches the head's seven). It gets one line, not
	// one per module, saying there is nothing to do.
	if !cfg.TargetAll {
		var mtp []string
		for _, l := range p.base.Tensors() {
			n := l.Info.Name
			if used[n] || len(l.Info.Shape) != 2 || !strings.HasSuffix(n, ".weight") {
				continue
			}
			m := rewrite.runtime(strings.TrimSuffix(n, ".weight"))
			if !cfg.Targets(m) {
				continue
			}
			if strings.HasPrefix(n, family.HFMTP) {
				mtp = append(mtp, m)
				continue
			}
			p.Warnings = append(p.Warnings, fmt.Sprintf("config targets %s but the adapter has no weights for it; it is copied unchanged", m))
		}
		if len(mtp) > 0 {
			p.Warnings = append(p.Warnings, fmt.Sprintf("config targets %d MTP-head modules (%s) that the adapter has no weights for, "+
				"as with every PEFT adapter of a model with an MTP head: transformers drops mtp.* when it loads the model, so PEFT never saw them to train; "+
				"nothing to do: the head is copied unchanged from the base and kept for speculative decoding (a PEFT merge drops it)", len(mtp), listSome(mtp, 3)))
		}
	}
	p.KeyRewrite = rewrite.used()

	// Shards: the base's names and tensor assignment, tensors in offset order.
	for _, sh := range p.base.Shards {
		sp := ShardPlan{Name: sh.Name, Size: sh.Size}
		for _, t := range sh.Tensors {
			op, ok := opOf[t.Name]
			if !ok {
				op = TensorOp{Name: t.Name, Op: OpCopy, Module: -1, DType: t.DType, Shape: t.Shape}
			} else {
				sp.Rewrite = true
			}
			op.BaseSize = t.Size()
			sp.Tensors = append(sp.Tensors, op)
		}
		p.TotalBytes += sh.Size
		p.Shards = append(p.Shards, sp)
	}
	p.Single = p.base.Index == nil
	if p.base.Index != nil {
		p.IndexMeta = map[string]any{}
		for k, v := range p.base.Index.Metadata {
			if k != "total_size" {
				p.IndexMeta[k] = v
			}
		}
	}
	if p.AuxFiles, err = auxFiles(baseDir); err != nil {
		return nil, err
	}
	if p.Key, err = p.digest(); err != nil {
		return nil, err
	}
	return p, nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func listSome(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(", … (%d more)", len(s)-n)
}

// keyMapper maps adapter module paths (runtime names) to checkpoint names.
// transformers ≥4.52 VLMs hold the text model at model.language_model.*;
// older adapters say language_model.model.*, and an adapter trained on the
// text-only model says model.*. The first candidate the base has wins.
type keyMapper struct {
	base     *safetensors.Checkpoint
	usedPair [2]string
}

func newKeyMapper(c *safetensors.Checkpoint) *keyMapper { return &keyMapper{base: c} }

// layoutPrefixes are the rewrites tried, in order, between the trunks of
// the family layouts (internal/family: the text-only model.*, the
// vision-language model.language_model.*) and the older VLM one.
var layoutPrefixes = [][2]string{
	{family.HFLanguageModel, oldVLMTrunk},
	{oldVLMTrunk, family.HFLanguageModel},
	{family.HFTrunk, family.HFLanguageModel},
	{family.HFLanguageModel, family.HFTrunk},
	{oldVLMTrunk, family.HFTrunk},
}

// oldVLMTrunk is where transformers before 4.52 kept a VLM's text model,
// as older adapters name it.
const oldVLMTrunk = "language_model.model."

func (k *keyMapper) candidates(name string) []string {
	out := []string{name}
	for _, pr := range layoutPrefixes {
		if strings.HasPrefix(name, pr[0]) && !strings.HasPrefix(name, pr[1]) {
			out = append(out, pr[1]+name[len(pr[0]):])
		}
	}
	return out
}

func matchingPair(from, to string) [2]string {
	for _, pr := range layoutPrefixes {
		if strings.HasPrefix(from, pr[0]) && strings.HasPrefix(to, pr[1]) && from[len(pr[0]):] == to[len(pr[1]):] {
			return pr
		}
	}
	return [2]string{}
}

// runtime maps a checkpoint module name back through the rewrite in use.
func (k *keyMapper) runtime(name string) string {
	if k.usedPair[0] != "" && strings.HasPrefix(name, k.usedPair[1]) {
		return k.usedPair[0] + name[len(k.usedPair[1]):]
	}
	return name
}

func (k *keyMapper) used() string {
	if k.usedPair[0] == "" {
		return ""
	}
	return k.usedPair[0] + "* → " + k.usedPair[1] + "*"
}

var shardNameRE = regexp.MustCompile(`^model-\d{5}-of-\d{5}\.safetensors$`)

// weightExts are files of other weight formats: never copied into a merged
// checkpoint, where they would be stale.
var weightExts = []string{".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".pkl", ".npz"}

// auxFiles lists the base directory's regular files a merged checkpoint
// carries over unchanged: config.json, generation_config.json, tokenizer
// files, chat templates, README, … but no weights, index or hidden files.
func auxFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") || n == safetensors.IndexName || shardNameRE.MatchString(n) {
			continue
		}
		skip := false
		for _, x := range weightExts {
			if strings.HasSuffix(strings.ToLower(n), x) {
				skip = true
			}
		}
		if skip {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// planVersion changes whenever the bytes a plan produces could change.
const planVersion = "ferry-merge/1"

// digest keys the plan by its inputs: every base shard's header and size,
// the adapter weights and config, the aux files' sizes, and the options.
func (p *Plan) digest() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", planVersion)
	for _, sh := range p.base.Shards {
		fmt.Fprintf(h, "shard %s %d\n", sh.Name, sh.Size)
		if _, err := io.Copy(h, io.NewSectionReader(sh.ReaderAt(), 0, sh.DataOffset())); err != nil {
			return "", err
		}
	}
	for _, name := range []string{p.AdapterWeights, filepath.Join(p.AdapterDir, AdapterConfigName)} {
		f, err := os.Open(name)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "file %s\n", filepath.Base(name))
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	for _, a := range p.AuxFiles {
		st, err := os.Stat(filepath.Join(p.BaseDir, a))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "aux %s %d\n", a, st.Size())
	}
	fmt.Fprintf(h, "dtype %s allow %v\n", p.DType, p.Unused)
	// A layout that overrides fan_in_fan_out depends on config.json's
	// model_type (for square weights), which the aux sizes do not pin.
	// Keys of plans without such modules stay as they were.
	for _, m := range p.Modules {
		if m.Kind == KindLinear && m.FanInFanOut != p.Config.FanInFanOut {
			fmt.Fprintf(h, "layout %s fan_in_fan_out %v\n", m.Name, m.FanInFanOut)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func numel(shape []int64) int64 {
	n, err := tensor.NumElements(shape)
	if err != nil {
		return -1
	}
	return n
}
