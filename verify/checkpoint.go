package verify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// sideFileRE matches an MTP side file next to an MLX directory's weights
// (mlx-lm PR #1543's layout): mlx-lm's loader reads only model*.safetensors,
// so tensors here are invisible to it.
var sideFileRE = regexp.MustCompile(`^mtp(-\d{5}-of-\d{5})?\.safetensors$`)

// checkpointDir resolves PATH to the directory to open: a directory, or the
// directory of a *.safetensors or index file named directly.
func checkpointDir(path string, fi fs.FileInfo) (string, error) {
	if fi.IsDir() {
		return path, nil
	}
	base := filepath.Base(path)
	if base == safetensors.IndexName || strings.HasSuffix(base, ".safetensors") {
		return filepath.Dir(path), nil
	}
	return "", badf(path, ErrNotModel, "")
}

// verifyCheckpoint checks a Hugging Face safetensors checkpoint or an MLX
// directory.
func verifyCheckpoint(path string, fi fs.FileInfo, opts Options) (*Report, error) {
	dir, err := checkpointDir(path, fi)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDirOptions(dir, safetensors.DirOptions{FollowExternalLinks: opts.FollowLinks})
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist) {
			// Unreadable shard or index (permissions, I/O): still the
			// input's fault as far as a user is concerned.
			return nil, inputerr.Wrap(dir, err)
		}
		return nil, err
	}
	defer ck.Close()
	if ck.Config == nil {
		return nil, badf(dir, ErrNoConfig, "")
	}
	var ts []*wTensor
	for _, l := range ck.Tensors() {
		ts = append(ts, &wTensor{name: l.Info.Name, dtype: l.Info.DType, shape: l.Info.Shape, loc: l, file: l.Shard.Name})
	}
	rep := &Report{Path: path, Format: FormatSafetensors, TemplateLayer: -1}
	if isMLX(ck.Config, ck.Shards) {
		rep.Format = FormatMLX
		side, closeSide, err := openSideFiles(dir, ck.Shards, rep)
		if err != nil {
			return nil, err
		}
		defer closeSide()
		inModel := make(map[string]bool, len(ts))
		for _, t := range ts {
			inModel[t.name] = true
		}
		for _, t := range side {
			if inModel[t.name] {
				return nil, badf(filepath.Join(dir, t.file), ErrBadMetadata, "tensor %q is both in the side file and in the model weights", t.name)
			}
		}
		ts = append(ts, side...)
	}
	w := newWeights(ts)
	if rep.Format == FormatMLX {
		if err := w.readQuantization(ck.Config); err != nil {
			return nil, err
		}
	}
	a := &ckAnalysis{rep: rep, w: w, cfg: ck.Config, opts: opts}
	if err := a.run(); err != nil {
		return nil, err
	}
	return rep, nil
}

// isMLX recognises a directory mlx-lm wrote: a "quantization" block in
// config.json (HF checkpoints use quantization_config), or shards stamped
// {"format": "mlx"} by mlx's save_safetensors.
func isMLX(cfg *safetensors.Config, shards []*safetensors.Shard) bool {
	if _, ok := cfg.Raw["quantization"]; ok {
		return true
	}
	for _, s := range shards {
		if s.Metadata["format"] == "mlx" {
			return true
		}
	}
	return false
}

// openSideFiles opens the mtp*.safetensors side files of an MLX directory
// that its index does not list (mlx-lm PR #1543's layout, with an index of
// its own); those the index lists (ferry's layout) are among shards already.
func openSideFiles(dir string, shards []*safetensors.Shard, rep *Report) ([]*wTensor, func(), error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, inputerr.Wrap(dir, err)
	}
	indexed := map[string]bool{}
	for _, sh := range shards {
		indexed[sh.Name] = true
		if sideFileRE.MatchString(sh.Name) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s is an MTP side file, listed in %s: mlx-lm's loader reads only model*.safetensors, so every mlx-lm loads the trunk without the head, and a loader that uses the head must read this file too", sh.Name, safetensors.IndexName))
		}
	}
	var files []*safetensors.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	var out []*wTensor
	for _, e := range entries {
		if !sideFileRE.MatchString(e.Name()) || indexed[e.Name()] {
			continue
		}
		f, err := safetensors.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		files = append(files, f)
		sh := &safetensors.Shard{Name: e.Name(), File: f}
		for _, t := range f.Tensors {
			out = append(out, &wTensor{name: t.Name, dtype: t.DType, shape: t.Shape, loc: safetensors.Location{Shard: sh, Info: t}, file: e.Name()})
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s is an MTP side file: mlx-lm's loader reads only model*.safetensors, so a loader must be told about it", e.Name()))
	}
	return out, closeAll, nil
}

// readQuantization reads config.json "quantization" (mlx.md §1): global
// group_size/bits/mode plus per-module entries (false or a dict).
func (w *weights) readQuantization(cfg *safetensors.Config) error {
	raw, ok := cfg.Raw["quantization"]
	if !ok {
		return nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return badf(cfg.Path, ErrBadMetadata, "\"quantization\" is not an object")
	}
	parse := func(key string, v map[string]any, base quantParams) (quantParams, error) {
		q := base
		for k, x := range v {
			switch k {
			case "group_size", "bits":
				n, ok := x.(json.Number)
				i, err := n.Int64()
				if !ok || err != nil || i <= 0 || i > 1<<20 {
					return q, badf(cfg.Path, ErrBadMetadata, "quantization %s: %s = %v is not a positive integer", key, k, x)
				}
				if k == "bits" {
					q.bits = i
				} else {
					q.groupSize = i
				}
			case "mode":
				s, ok := x.(string)
				if !ok {
					return q, badf(cfg.Path, ErrBadMetadata, "quantization %s: mode %v is not a string", key, x)
				}
				q.mode = s
			}
		}
		return q, nil
	}
	// Defaults per mode (mlx.md §1): affine 64/4.
	global, err := parse("(global)", m, quantParams{groupSize: 64, bits: 4, mode: "affine"})
	if err != nil {
		return err
	}
	w.quant = &global
	w.quantFor = map[string]*quantParams{}
	for k, v := range m {
		switch v := v.(type) {
		case bool:
			if !v {
				w.quantFor[k] = nil
			}
		case map[string]any:
			q, err := parse(strconv.Quote(k), v, global)
			if err != nil {
				return err
			}
			w.quantFor[k] = &q
		}
	}
	return nil
}

// ckAnalysis checks one checkpoint's head.
type ckAnalysis struct {
	rep  *Report
	w    *weights
	cfg  *safetensors.Config
	opts Options

	trunkPrefix string // "model.", "model.language_model.", "language_model.model."
	hidden      int64
	vocab       int64
	present     []*wTensor // head tensors found, for --deep
	// countMismatch: head layers beyond the promised count.
	countMismatch bool
}

func (a *ckAnalysis) run() error {
	rep, w, cfg := a.rep, a.w, a.cfg
	rep.Arch = cfg.Architecture()
	if rep.Arch == "" {
		rep.Arch = cfg.ModelType
	}
	a.trunkPrefix = trunkPrefixOf(w)
	if a.trunkPrefix == "" && len(w.layerIndices("layers.")) == 0 {
		return badf(rep.Path, ErrNotModel, "no decoder layers (model.layers.N.*) in the weight index")
	}
	nHidden, ok := cfg.Int("num_hidden_layers")
	if !ok || nHidden <= 0 {
		return badf(cfg.Path, ErrBadMetadata, "num_hidden_layers is missing or not a positive integer")
	}
	if nHidden > 1<<20 {
		return badf(cfg.Path, ErrBadMetadata, "num_hidden_layers = %d is implausible", nHidden)
	}
	rep.TrunkLayers = int(nHidden)
	a.hidden, _ = cfg.Int("hidden_size")
	a.vocab, _ = cfg.Int("vocab_size")

	// What the config promises.
	qwenN, qwenKey, err := countKey(cfg, "mtp_num_hidden_layers")
	if err != nil {
		return err
	}
	nextnN, nextnKey, err := countKey(cfg, "num_nextn_predict_layers")
	if err != nil {
		return err
	}
	mtpPrefix, mtpNames := a.findQwenHead()
	switch {
	case qwenKey:
		rep.Convention, rep.Promised, rep.PromisedBy = ConvQwen, int(qwenN), "mtp_num_hidden_layers"
	case len(mtpNames) > 0 || (nextnKey && qwenHead(cfg)):
		// Qwen3-Next: vLLM reads num_nextn_predict_layers, the head is mtp.*.
		rep.Convention = ConvQwen
		if nextnKey {
			rep.Promised, rep.PromisedBy = int(nextnN), "num_nextn_predict_layers"
		}
	case nextnKey:
		rep.Convention, rep.Promised, rep.PromisedBy = ConvNextN, int(nextnN), "num_nextn_predict_layers"
	default:
		if extra := a.nextnLayers(); len(extra) > 0 {
			rep.Convention = ConvNextN
		}
	}
	switch rep.Convention {
	case ConvQwen:
		if mtpPrefix == "" {
			mtpPrefix = a.defaultQwenPrefix()
		}
		a.checkQwen(mtpPrefix)
	case ConvNextN:
		a.checkNextN()
	}
	if rep.Format == FormatMLX {
		a.mlxNotes(mtpNames)
	}
	if a.opts.Deep {
		rep.Deep = true
		if err := a.deep(); err != nil {
			return err
		}
	}
	rep.Present = checkpointHead(w, cfg).count()
	decide(rep, a.countMismatch)
	a.explain()
	return nil
}

// findQwenHead finds mtp.* tensors under any prefix a family descriptor
// keeps them at (the HF top level, also in ConditionalGeneration
// checkpoints, an older model.mtp., MLX after sanitize).
func (a *ckAnalysis) findQwenHead() (prefix string, names []string) {
	for _, p := range family.MTPPrefixes() {
		if ns := a.w.withPrefix(p); len(ns) > 0 {
			if prefix == "" {
				prefix = p
			}
			names = append(names, ns...)
		}
	}
	return prefix, names
}

// defaultQwenPrefix is where the head would be if it were there.
func (a *ckAnalysis) defaultQwenPrefix() string {
	if a.trunkPrefix == family.MLXQwen35Trunk {
		return family.MLXQwen35MTP
	}
	return family.HFMTP
}

// nextnLayers lists decoder layers at index >= num_hidden_layers.
func (a *ckAnalysis) nextnLayers() []int {
	var out []int
	for _, i := range a.w.layerIndices(a.trunkPrefix + "layers.") {
		if i >= a.rep.TrunkLayers {
			out = append(out, i)
		}
	}
	return out
}

// templateLayer is the trunk layer the head's decoder block should match:
// the last trunk layer with full attention (self_attn.*). Qwen3.5 hybrids
// interleave linear-attention layers; MTP layers are always full attention.
func (a *ckAnalysis) templateLayer() int {
	idx := a.w.layerIndices(a.trunkPrefix + "layers.")
	for k := len(idx) - 1; k >= 0; k-- {
		i := idx[k]
		if i >= a.rep.TrunkLayers {
			continue
		}
		if len(a.w.withPrefix(fmt.Sprintf("%slayers.%d.self_attn.", a.trunkPrefix, i))) > 0 {
			return i
		}
	}
	return -1
}

// hiddenSize is hidden_size, or the trunk's final norm width.
func (a *ckAnalysis) hiddenSize() int64 {
	if a.hidden > 0 {
		return a.hidden
	}
	if t, ok := a.w.get(a.trunkPrefix + "norm.weight"); ok && len(t.shape) == 1 {
		return t.shape[0]
	}
	return 0
}

func (a *ckAnalysis) vocabSize() int64 {
	if a.vocab > 0 {
		return a.vocab
	}
	if t, ok := a.w.get(a.trunkPrefix + "embed_tokens.weight"); ok && len(t.shape) == 2 {
		return t.shape[0]
	}
	return 0
}

// special is a head tensor outside the decoder block, with the shape the
// trunk implies (0 = unknown dimension).
type special struct {
	rel      string
	want     []int64
	required bool
}

func (a *ckAnalysis) checkQwen(prefix string) {
	rep := a.rep
	h := a.hiddenSize()
	specials := []special{
		{"fc.weight", []int64{h, 2 * h}, true}, // Linear 2H → H: [out, in]
		{"pre_fc_norm_embedding.weight", []int64{h}, true},
		{"pre_fc_norm_hidden.weight", []int64{h}, true},
		{"norm.weight", []int64{h}, true},
	}
	// Dedicated MTP embeddings (mtp_use_dedicated_embeddings; Qwen3.5
	// ships false and shares the trunk's embed_tokens).
	dedicated, _ := a.cfg.Bool("mtp_use_dedicated_embeddings")
	if _, ok := a.w.get(prefix + "embed_tokens.weight"); ok || dedicated {
		specials = append(specials, special{"embed_tokens.weight", []int64{a.vocabSize(), h}, dedicated})
	}
	for _, s := range specials {
		a.checkSpecial(prefix+s.rel, s)
	}
	found := a.w.layerIndices(prefix + "layers.")
	rep.FoundLayers = found
	a.checkLayers(found, func(i int) string { return fmt.Sprintf("%slayers.%d.", prefix, i) }, nil, rep.Promised)
	// Anything else under the head's prefix is unexpected.
	known := map[string]bool{}
	for _, s := range specials {
		known[prefix+s.rel] = true
	}
	for _, n := range a.w.withPrefix(prefix) {
		if known[n] || strings.HasPrefix(n, prefix+"layers.") {
			continue
		}
		if base, ok := companionOf(n); ok && known[base+".weight"] {
			continue
		}
		a.addPresent(n, "", nil)
		rep.Problems = append(rep.Problems, fmt.Sprintf("%s: not part of a Qwen MTP head", n))
	}
}

func (a *ckAnalysis) checkNextN() {
	rep := a.rep
	h, v := a.hiddenSize(), a.vocabSize()
	specials := []special{
		{"embed_tokens.weight", []int64{v, h}, true},
		{"enorm.weight", []int64{h}, true},
		{"hnorm.weight", []int64{h}, true},
		{"eh_proj.weight", []int64{h, 2 * h}, true}, // 2H → H
		{"shared_head.norm.weight", []int64{h}, true},
		{"shared_head.head.weight", []int64{v, h}, true},
	}
	skip := map[string]bool{}
	for _, s := range specials {
		skip[s.rel] = true
	}
	found := a.nextnLayers()
	rep.FoundLayers = found
	layerPrefix := func(i int) string { return fmt.Sprintf("%slayers.%d.", a.trunkPrefix, rep.TrunkLayers+i) }
	// MTP-relative indices.
	rel := make([]int, len(found))
	for k, i := range found {
		rel[k] = i - rep.TrunkLayers
	}
	for _, i := range headIndices(rep.Promised, rel) {
		for _, s := range specials {
			a.checkSpecial(layerPrefix(i)+s.rel, s)
		}
	}
	a.checkLayers(rel, layerPrefix, skip, rep.Promised)
}

// checkSpecial checks one head tensor outside the decoder block.
func (a *ckAnalysis) checkSpecial(name string, s special) {
	rep := a.rep
	t, ok := a.w.get(name)
	if !ok {
		rep.Tensors = append(rep.Tensors, Tensor{Name: name, Required: s.required, Want: known(s.want)})
		if s.required {
			rep.Missing = append(rep.Missing, name)
		}
		return
	}
	shape, q, problem := a.w.logical(t)
	for _, c := range a.w.missingCompanions(t) {
		rep.Missing = append(rep.Missing, c)
		rep.Tensors = append(rep.Tensors, Tensor{Name: c, Required: true})
	}
	if problem == "" {
		if want := known(s.want); want != nil && !slices.Equal(shape, want) {
			problem = fmt.Sprintf("shape %v, want %v", shape, want)
		}
	}
	if problem == "" && !q && !floatDType(t.dtype) && !a.sameAsTrunk(t.dtype) {
		problem = fmt.Sprintf("dtype %s is neither a float type nor the trunk's", t.dtype)
	}
	if problem != "" {
		rep.Problems = append(rep.Problems, name+": "+problem)
	}
	a.addPresentTensor(t, known(s.want), problem, true)
}

// known returns want unless a dimension of it is unknown (0).
func known(want []int64) []int64 {
	for _, d := range want {
		if d <= 0 {
			return nil
		}
	}
	return want
}

// sameAsTrunk reports whether some trunk weight has dtype d (FP8 heads of
// FP8 checkpoints are consistent).
func (a *ckAnalysis) sameAsTrunk(d tensor.DType) bool {
	for _, n := range a.w.withPrefix(a.trunkPrefix + "layers.") {
		if a.w.byName[n].dtype == d {
			return true
		}
	}
	return false
}

// checkLayers compares each head decoder layer with the trunk template.
// found holds MTP-relative layer indices that have tensors; promised is how
// many the config promises.
func (a *ckAnalysis) checkLayers(found []int, prefixOf func(int) string, skip map[string]bool, promised int) {
	rep := a.rep
	heads := headIndices(promised, found)
	n := len(heads)
	if n > promised && promised > 0 {
		a.countMismatch = true
	}
	if len(found) > promised {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d MTP layer(s) in the weight index but the config promises %d", len(found), promised))
	} else if n > promised {
		rep.Problems = append(rep.Problems, fmt.Sprintf("MTP layer %d is in the weight index but the config promises %d layer(s)", heads[n-1], promised))
	}
	tl := a.templateLayer()
	rep.TemplateLayer = tl
	var tmpl map[string]*slot
	tmplPrefix := ""
	if tl >= 0 {
		tmplPrefix = fmt.Sprintf("%slayers.%d.", a.trunkPrefix, tl)
		tmpl, _ = a.w.layerSlots(tmplPrefix, nil)
	} else if n > 0 {
		rep.Problems = append(rep.Problems, "no trunk layer with full attention (self_attn.*) to compare the MTP layer with")
	}
	keys := make([]string, 0, len(tmpl))
	for k := range tmpl {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, i := range heads {
		p := prefixOf(i)
		got, missing := a.w.layerSlots(p, skip)
		for _, m := range missing {
			rep.Missing = append(rep.Missing, m)
			rep.Tensors = append(rep.Tensors, Tensor{Name: m, Required: true})
		}
		for _, k := range keys {
			ts := tmpl[k]
			gs, ok := got[k]
			if !ok {
				for _, name := range expectedNames(ts, tmplPrefix, p) {
					rep.Missing = append(rep.Missing, name)
					rep.Tensors = append(rep.Tensors, Tensor{Name: name, Required: true, Want: ts.shape})
				}
				continue
			}
			a.missingExperts(p, k, gs, ts)
			problem := strings.Join(gs.problems, "; ")
			if problem == "" && !slices.Equal(gs.shape, ts.shape) {
				problem = fmt.Sprintf("shape %v, but trunk layer %d has %v", gs.shape, tl, ts.shape)
			}
			if problem == "" && !gs.quantized && !floatDType(gs.dtype) && gs.dtype != ts.dtype {
				problem = fmt.Sprintf("dtype %s, but trunk layer %d has %s", gs.dtype, tl, ts.dtype)
			}
			if problem != "" {
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s%s: %s", p, k, problem))
			}
			for _, name := range gs.names {
				a.addPresentTensor(a.w.byName[name], ts.shape, problem, true)
			}
		}
		extra := make([]string, 0)
		for k := range got {
			if _, ok := tmpl[k]; !ok && tmpl != nil {
				extra = append(extra, k)
			}
		}
		sort.Strings(extra)
		for _, k := range extra {
			gs := got[k]
			rep.Problems = append(rep.Problems, fmt.Sprintf("%s%s: not in trunk layer %d", p, k, tl))
			for _, name := range gs.names {
				a.addPresentTensor(a.w.byName[name], nil, "not in the trunk template layer", false)
			}
		}
		if tmpl == nil {
			for _, k := range sortedKeys(got) {
				for _, name := range got[k].names {
					a.addPresentTensor(a.w.byName[name], nil, "", false)
				}
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// addPresent records a present tensor by name.
func (a *ckAnalysis) addPresent(name, problem string, want []int64) {
	if t, ok := a.w.get(name); ok {
		a.addPresentTensor(t, want, problem, false)
	}
}

// addPresentTensor records a present head tensor and its companions (which
// --deep reads too).
func (a *ckAnalysis) addPresentTensor(t *wTensor, want []int64, problem string, required bool) {
	a.rep.Tensors = append(a.rep.Tensors, Tensor{Name: t.name, Required: required, Present: true, DType: string(t.dtype), Shape: t.shape, Want: want, Problem: problem})
	a.present = append(a.present, t)
	for _, s := range companionSuffixes {
		base := strings.TrimSuffix(t.name, ".weight")
		if c, ok := a.w.get(base + s); ok && c != t {
			a.rep.Tensors = append(a.rep.Tensors, Tensor{Name: c.name, Required: required, Present: true, DType: string(c.dtype), Shape: c.shape})
			a.present = append(a.present, c)
		}
	}
}

// missingExperts names the experts a per-expert head slot lacks at its end
// (a gap in the middle is found by layerSlots), when the trunk has more:
// the head is then partial, not merely a different shape.
func (a *ckAnalysis) missingExperts(prefix, key string, got, tmpl *slot) {
	rel, ok := strings.CutPrefix(key, "mlp.experts.*")
	if !ok || len(got.shape) < 1 || len(tmpl.shape) != len(got.shape) || got.shape[0] >= tmpl.shape[0] {
		return
	}
	if !slices.Equal(got.shape[1:], tmpl.shape[1:]) || len(got.names) != int(got.shape[0]) {
		return // fused or stacked: a shape problem, reported by the caller
	}
	for e := got.shape[0]; e < tmpl.shape[0]; e++ {
		name := fmt.Sprintf("%smlp.experts.%d%s", prefix, e, rel)
		a.rep.Missing = append(a.rep.Missing, name)
		a.rep.Tensors = append(a.rep.Tensors, Tensor{Name: name, Required: true, Want: tmpl.shape[1:]})
	}
	got.shape = slices.Clone(tmpl.shape) // the missing ones are reported as missing
}

// headIndices are the head layers to check: the promised ones and any
// found (never a range up to a huge index some tensor name claims).
func headIndices(promised int, found []int) []int {
	out := make([]int, 0, promised+len(found))
	for i := 0; i < promised; i++ {
		out = append(out, i)
	}
	for _, i := range found {
		if i >= promised {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return slices.Compact(out)
}

// countKey reads an MTP count from config.json: absent is fine, present it
// must be a small non-negative integer.
func countKey(cfg *safetensors.Config, key string) (int64, bool, error) {
	v, ok := cfg.Get(key)
	if !ok || v == nil {
		return 0, false, nil
	}
	n, isInt := cfg.Int(key)
	if !isInt || n < 0 || n > 1024 {
		return 0, true, badf(cfg.Path, ErrBadMetadata, "%s = %v: want an integer from 0 to 1024", key, v)
	}
	return n, true, nil
}

// qwenHead reports a checkpoint whose family keeps its head Qwen's way
// (mtp.*, whatever key counts it): the family descriptor found by
// architectures[0], model_type or text_config's model_type
// (internal/family).
func qwenHead(cfg *safetensors.Config) bool {
	tc, _ := cfg.String("model_type")
	f, ok := family.ByConfig(cfg.Architecture(), cfg.ModelType, tc)
	return ok && f.MTP.Convention == family.QwenMTP
}
