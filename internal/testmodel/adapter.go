package testmodel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// AdapterOptions configures a PEFT LoRA / DoRA adapter written the way
// peft 0.21 save_pretrained writes one: adapter_config.json (every field
// peft 0.21 writes, sorted, indent 2) and adapter_model.safetensors (F32,
// keys base_model.model.<module>.lora_A.weight, .lora_B.weight,
// .lora_magnitude_vector; embeddings .lora_embedding_A / _B).
//
// Values, as in the reference adapters: lora_A ~ U(−1/√in, 1/√in), lora_B
// ~ N(0, 0.02) (nonzero, so merges change weights), DoRA magnitudes = the
// base weight's row norms (column norms for embeddings) × (1 + 0.05·N(0,1)).
type AdapterOptions struct {
	Seed  uint64
	R     int     // default 8
	Alpha float64 // lora_alpha, default 16

	// Targets. TargetModules is PEFT's list form (a module matches when its
	// name equals an entry or ends with "."+entry); TargetRegex, when set,
	// is written as a string and matched against the whole module name
	// (PEFT's re.fullmatch); AllLinear writes "all-linear" (every Linear but
	// the output layer). Default: q_proj and v_proj.
	TargetModules []string
	TargetRegex   string
	AllLinear     bool
	// LayersToTransform / LayersPattern apply only to the list form, as in
	// PEFT: the layer index is the number matched by
	// `.*\.[^.]*\.(\d+)\.` (greedy: the last numbered segment) or, with a
	// pattern, `.*\.<pattern>\.(\d+)\.`.
	LayersToTransform []int
	LayersPattern     string

	DoRA   bool
	RSLoRA bool
	// RankPattern / AlphaPattern map a regex to r / alpha; PEFT tries the
	// keys in (sorted, as saved) order with re.match("(.*\.)?(key)$").
	RankPattern  map[string]int
	AlphaPattern map[string]float64

	// FanInFanOut: the base weights are stored [in, out] (GPT-2 Conv1D), so
	// A is [r, dim0] and B is [dim1, r].
	FanInFanOut bool
	// LoRABias adds lora_B.bias [out] (the base module must have a bias;
	// not with DoRA — PEFT refuses both).
	LoRABias bool
	// ModulesToSave writes full replacement tensors <module>.weight (and
	// .bias) in the base dtype for every module whose name ends with an
	// entry: base values + N(0, 0.01).
	ModulesToSave []string
	// SaveEmbeddingLayers writes <module>.base_layer.weight (a copy of the
	// base) for targeted embed_tokens / lm_head modules, as PEFT's
	// save_embedding_layers="auto" does when they are targeted.
	SaveEmbeddingLayers bool
	// MagnitudeWeightSuffix writes lora_magnitude_vector.weight (some
	// third-party exporters) instead of PEFT's lora_magnitude_vector.
	MagnitudeWeightSuffix bool
	// BaseModelNameOrPath for the config; default: the base directory
	// relative to the adapter directory.
	BaseModelNameOrPath string
}

// AdapterModule is one adapted module.
type AdapterModule struct {
	Module     string // module path, e.g. model.layers.0.self_attn.q_proj
	BaseTensor string // the base tensor the delta applies to (Module + ".weight")
	Embedding  bool   // lora_embedding_A/B, ΔW = (B·A)ᵀ·scale
	// In and Out are the module's features (for an embedding: num_embeddings
	// and embedding_dim).
	In, Out int64
	R       int
	Alpha   float64
	Scale   float64 // alpha/r, or alpha/√r with rsLoRA
	// Keys in adapter_model.safetensors ("" when absent).
	A, B, Magnitude, Bias string
}

// Adapter describes an adapter a generator wrote.
type Adapter struct {
	Dir     string
	Config  map[string]any
	Seed    uint64
	Modules []AdapterModule // sorted by module name
	Tensors []Tensor        // adapter_model.safetensors, in file order

	index  map[string]int
	values map[string]func() []float32
}

// Module returns the adapted module with that path.
func (a *Adapter) Module(path string) (AdapterModule, bool) {
	for _, m := range a.Modules {
		if m.Module == path {
			return m, true
		}
	}
	return AdapterModule{}, false
}

// Lookup returns the named adapter tensor.
func (a *Adapter) Lookup(key string) (Tensor, bool) {
	i, ok := a.index[key]
	if !ok {
		return Tensor{}, false
	}
	return a.Tensors[i], true
}

// Values returns an adapter tensor's values exactly as stored, as float32.
func (a *Adapter) Values(key string) ([]float32, error) {
	f, ok := a.values[key]
	if !ok {
		return nil, fmt.Errorf("testmodel: adapter has no tensor %q", key)
	}
	return f(), nil
}

// baseSource is what the adapter generator needs from a base checkpoint.
type baseSource struct {
	dir       string
	numLayers int
	prefix    string
	names     []string
	info      map[string]Tensor
	// chunks feeds a tensor's stored values, as float32, in order.
	chunks func(name string, fn func([]float32)) error
}

func sourceFromModel(m *Model) *baseSource {
	s := &baseSource{dir: m.Dir, numLayers: m.NumLayers, prefix: m.Prefix, info: map[string]Tensor{}}
	for _, t := range m.Tensors {
		s.names = append(s.names, t.Name)
		s.info[t.Name] = t
	}
	s.chunks = func(name string, fn func([]float32)) error {
		t := s.info[name]
		g := newGen(m.Seed, t.Name, t.Init, m.RepeatBlock)
		if b := m.RepeatBlock; b > 0 && t.NumElements() > b {
			// Generate the block once and feed it again and again.
			blk := make([]float32, b)
			g.fill(blk)
			roundTrip(t.DType, blk)
			for left := t.NumElements(); left > 0; {
				k := min(left, b)
				fn(blk[:k])
				left -= k
			}
			return nil
		}
		buf := make([]float32, chunkElems)
		for left := t.NumElements(); left > 0; {
			k := min(left, int64(chunkElems))
			v := buf[:k]
			g.fill(v)
			roundTrip(t.DType, v)
			fn(v)
			left -= k
		}
		return nil
	}
	return s
}

func sourceFromDir(dir string) (*baseSource, func() error, error) {
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &baseSource{dir: dir, info: map[string]Tensor{}, prefix: "model."}
	if ck.Config != nil {
		if n, ok := ck.Config.Int("num_hidden_layers"); ok {
			s.numLayers = int(n)
		}
		if _, nested := ck.Config.Raw["text_config"]; nested {
			s.prefix = "model.language_model."
		}
	}
	for _, l := range ck.Tensors() {
		s.names = append(s.names, l.Info.Name)
		s.info[l.Info.Name] = Tensor{Name: l.Info.Name, DType: l.Info.DType, Shape: l.Info.Shape, Shard: l.Shard.Name}
	}
	s.chunks = func(name string, fn func([]float32)) error {
		loc, _ := ck.Lookup(name)
		if !loc.Info.DType.Convertible() {
			return fmt.Errorf("testmodel: %s: tensor %q has dtype %s", dir, name, loc.Info.DType)
		}
		es := int64(loc.Info.DType.Bits() / 8)
		r := loc.Section()
		raw := make([]byte, chunkElems*es)
		v := make([]float32, chunkElems)
		for left := loc.Info.NumElements(); left > 0; {
			k := min(left, int64(chunkElems))
			if _, err := io.ReadFull(r, raw[:k*es]); err != nil {
				return fmt.Errorf("testmodel: %s: tensor %q: %w", dir, name, err)
			}
			if err := tensor.ToF32(loc.Info.DType, v[:k], raw[:k*es]); err != nil {
				return err
			}
			fn(v[:k])
			left -= k
		}
		return nil
	}
	return s, ck.Close, nil
}

// Write writes the adapter for base into dir.
func (o AdapterOptions) Write(dir string, base *Model) (*Adapter, error) {
	return o.write(dir, sourceFromModel(base))
}

// WriteForDir writes an adapter for the checkpoint in baseDir (read with
// safetensors.OpenDir; only the tensors DoRA norms and modules_to_save need
// are read, one at a time).
func (o AdapterOptions) WriteForDir(dir, baseDir string) (*Adapter, error) {
	s, closeFn, err := sourceFromDir(baseDir)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return o.write(dir, s)
}

var layerRE = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

// candidates lists the modules PEFT would see in the loaded model: every 2-D
// ".weight" outside the MTP block (transformers drops mtp.* and layers past
// num_hidden_layers on load).
func (s *baseSource) candidates() []AdapterModule {
	var out []AdapterModule
	for _, n := range s.names {
		t := s.info[n]
		if !strings.HasSuffix(n, ".weight") || len(t.Shape) != 2 || strings.HasPrefix(n, "mtp.") {
			continue
		}
		if m := layerRE.FindStringSubmatch(n); m != nil && s.numLayers > 0 {
			if l, _ := strconv.Atoi(m[1]); l >= s.numLayers {
				continue
			}
		}
		mod := strings.TrimSuffix(n, ".weight")
		out = append(out, AdapterModule{Module: mod, BaseTensor: n, Embedding: lastPart(mod) == "embed_tokens"})
	}
	return out
}

func lastPart(s string) string { return s[strings.LastIndexByte(s, '.')+1:] }

func (o AdapterOptions) matcher() (func(string) bool, any, error) {
	switch {
	case o.TargetRegex != "":
		re, err := regexp.Compile(`^(?:` + o.TargetRegex + `)$`)
		if err != nil {
			return nil, nil, fmt.Errorf("testmodel: target regex: %w", err)
		}
		return re.MatchString, o.TargetRegex, nil
	case o.AllLinear:
		return nil, "all-linear", nil
	}
	keys := o.TargetModules
	if keys == nil {
		keys = []string{"q_proj", "v_proj"}
	}
	var layerSel *regexp.Regexp
	if o.LayersToTransform != nil {
		pat := `^.*\.[^.]*\.(\d+)\.`
		if o.LayersPattern != "" {
			pat = `^.*\.` + o.LayersPattern + `\.(\d+)\.`
		}
		var err error
		if layerSel, err = regexp.Compile(pat); err != nil {
			return nil, nil, fmt.Errorf("testmodel: layers_pattern: %w", err)
		}
	}
	match := func(name string) bool {
		ok := false
		for _, k := range keys {
			if name == k || strings.HasSuffix(name, "."+k) {
				ok = true
				break
			}
		}
		if !ok || layerSel == nil {
			return ok
		}
		m := layerSel.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		l, _ := strconv.Atoi(m[1])
		for _, want := range o.LayersToTransform {
			if l == want {
				return true
			}
		}
		return false
	}
	return match, keys, nil
}

// patternValue is PEFT's get_pattern_key: the first key, in sorted order,
// with re.match(`(.*\.)?(key)$`, name).
func patternValue[T any](pats map[string]T, name string) (T, bool, error) {
	keys := make([]string, 0, len(pats))
	for k := range pats {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		re, err := regexp.Compile(`^(?:.*\.)?(?:` + k + `)$`)
		if err != nil {
			var z T
			return z, false, fmt.Errorf("testmodel: pattern %q: %w", k, err)
		}
		if re.MatchString(name) {
			return pats[k], true, nil
		}
	}
	var z T
	return z, false, nil
}

func (o AdapterOptions) write(dir string, s *baseSource) (*Adapter, error) {
	if o.R == 0 {
		o.R = 8
	}
	if o.Alpha == 0 {
		o.Alpha = 16
	}
	if o.DoRA && o.LoRABias {
		return nil, fmt.Errorf("testmodel: PEFT rejects lora_bias with DoRA")
	}
	match, targetJSON, err := o.matcher()
	if err != nil {
		return nil, err
	}
	if o.AllLinear {
		match = func(name string) bool { return name != "lm_head" && lastPart(name) != "embed_tokens" }
	}
	a := &Adapter{Dir: dir, Seed: o.Seed, index: map[string]int{}, values: map[string]func() []float32{}}
	type planned struct {
		t  Tensor
		fn func() []float32 // nil: generated from (Seed, name, Init)
	}
	var plan []planned
	addGen := func(key string, init Init, shape ...int64) {
		t := Tensor{Name: key, DType: tensor.F32, Shape: shape, Init: init}
		plan = append(plan, planned{t: t})
		seed := o.Seed
		a.values[key] = func() []float32 { return Values(seed, key, t.NumElements(), init, 0) }
	}
	addVals := func(key string, d tensor.DType, shape []int64, vals []float32) {
		v := roundTrip(d, vals)
		plan = append(plan, planned{t: Tensor{Name: key, DType: d, Shape: shape}, fn: func() []float32 { return v }})
		a.values[key] = func() []float32 { return append([]float32(nil), v...) }
	}

	for _, m := range s.candidates() {
		if !match(m.Module) {
			continue
		}
		bt := s.info[m.BaseTensor]
		d0, d1 := bt.Shape[0], bt.Shape[1]
		m.R, m.Alpha = o.R, o.Alpha
		if r, ok, err := patternValue(o.RankPattern, m.Module); err != nil {
			return nil, err
		} else if ok {
			m.R = r
		}
		if al, ok, err := patternValue(o.AlphaPattern, m.Module); err != nil {
			return nil, err
		} else if ok {
			m.Alpha = al
		}
		if m.R <= 0 {
			return nil, fmt.Errorf("testmodel: module %s: rank %d", m.Module, m.R)
		}
		if o.RSLoRA {
			m.Scale = m.Alpha / math.Sqrt(float64(m.R))
		} else {
			m.Scale = m.Alpha / float64(m.R)
		}
		r := int64(m.R)
		key := "base_model.model." + m.Module
		if m.Embedding {
			m.In, m.Out = d0, d1 // num_embeddings, embedding_dim
			m.A, m.B = key+".lora_embedding_A", key+".lora_embedding_B"
			addGen(m.A, UniformInit(-1/math.Sqrt(float64(m.In)), 1/math.Sqrt(float64(m.In))), r, m.In)
			addGen(m.B, NormalInit(0, 0.02), m.Out, r)
		} else {
			m.Out, m.In = d0, d1
			if o.FanInFanOut {
				m.In, m.Out = d0, d1
			}
			m.A, m.B = key+".lora_A.weight", key+".lora_B.weight"
			addGen(m.A, UniformInit(-1/math.Sqrt(float64(m.In)), 1/math.Sqrt(float64(m.In))), r, m.In)
			addGen(m.B, NormalInit(0, 0.02), m.Out, r)
			if o.LoRABias {
				bias := strings.TrimSuffix(m.BaseTensor, ".weight") + ".bias"
				if _, ok := s.info[bias]; !ok {
					return nil, fmt.Errorf("testmodel: lora_bias on %s, which has no bias (PEFT refuses)", m.Module)
				}
				m.Bias = key + ".lora_B.bias"
				addGen(m.Bias, NormalInit(0, 0.02), m.Out)
			}
		}
		if o.DoRA {
			m.Magnitude = key + ".lora_magnitude_vector"
			if o.MagnitudeWeightSuffix {
				m.Magnitude += ".weight"
			}
			// Linear: one norm per output row; embeddings and fan_in_fan_out
			// (stored [in, out]): one per stored column.
			perCol := m.Embedding || o.FanInFanOut
			norms, err := weightNorms(s, m.BaseTensor, d0, d1, perCol)
			if err != nil {
				return nil, err
			}
			g := newGen(o.Seed, m.Magnitude, NormalInit(0, 1), 0)
			noise := make([]float32, len(norms))
			g.fill(noise)
			mag := make([]float32, len(norms))
			for i := range norms {
				mag[i] = float32(norms[i] * (1 + 0.05*float64(noise[i])))
			}
			addVals(m.Magnitude, tensor.F32, []int64{int64(len(mag))}, mag)
		}
		if o.SaveEmbeddingLayers && (m.Embedding || lastPart(m.Module) == "lm_head") {
			v, err := allValues(s, m.BaseTensor)
			if err != nil {
				return nil, err
			}
			addVals(key+".base_layer.weight", bt.DType, bt.Shape, v)
		}
		a.Modules = append(a.Modules, m)
	}
	if len(a.Modules) == 0 {
		return nil, fmt.Errorf("testmodel: no module of %s matches the targets %v", s.dir, targetJSON)
	}
	for _, n := range s.names {
		mod, param, ok := cutLast(n)
		if !ok || (param != "weight" && param != "bias") || !saveMatch(o.ModulesToSave, mod) {
			continue
		}
		if _, targeted := a.Module(mod); targeted {
			return nil, fmt.Errorf("testmodel: %s is both targeted and in modules_to_save", mod)
		}
		v, err := allValues(s, n)
		if err != nil {
			return nil, err
		}
		g := newGen(o.Seed, "modules_to_save."+n, NormalInit(0, 0.01), 0)
		noise := make([]float32, len(v))
		g.fill(noise)
		for i := range v {
			v[i] += noise[i]
		}
		bt := s.info[n]
		addVals("base_model.model."+n, bt.DType, bt.Shape, v)
	}
	sort.Slice(a.Modules, func(i, j int) bool { return a.Modules[i].Module < a.Modules[j].Module })

	specs := make([]safetensors.TensorSpec, len(plan))
	byKey := map[string]planned{}
	for i, p := range plan {
		specs[i] = safetensors.TensorSpec{Name: p.t.Name, DType: p.t.DType, Shape: p.t.Shape}
		byKey[p.t.Name] = p
	}
	safetensors.SortReference(specs)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	w, err := safetensors.Create(filepath.Join(dir, "adapter_model.safetensors"), map[string]string{"format": "pt"}, specs)
	if err != nil {
		return nil, fmt.Errorf("testmodel: %w", err)
	}
	for _, sp := range specs {
		p := byKey[sp.Name]
		var r io.Reader
		if p.fn == nil {
			r = newTensorReader(o.Seed, p.t, 0)
		} else {
			buf := make([]byte, p.t.Size())
			if err := tensor.FromF32(p.t.DType, buf, p.fn()); err != nil {
				w.Abort()
				return nil, err
			}
			r = bytes.NewReader(buf)
		}
		if err := w.WriteTensor(sp.Name, r); err != nil {
			w.Abort()
			return nil, fmt.Errorf("testmodel: %w", err)
		}
		a.index[sp.Name] = len(a.Tensors)
		a.Tensors = append(a.Tensors, p.t)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("testmodel: %w", err)
	}

	baseName := o.BaseModelNameOrPath
	if baseName == "" {
		if rel, err := filepath.Rel(dir, s.dir); err == nil {
			baseName = rel
		} else {
			baseName = s.dir
		}
	}
	cfg := map[string]any{
		"alora_invocation_tokens": nil,
		"alpha_pattern":           numberMap(o.AlphaPattern),
		"arrow_config":            nil,
		"auto_mapping":            nil,
		"base_model_name_or_path": baseName,
		"bias":                    "none",
		"corda_config":            nil,
		"ensure_weight_tying":     false,
		"eva_config":              nil,
		"exclude_modules":         nil,
		"fan_in_fan_out":          o.FanInFanOut,
		"inference_mode":          true,
		"init_lora_weights":       true,
		"kasa_config":             nil,
		"layer_replication":       nil,
		"layers_pattern":          nil,
		"layers_to_transform":     nil,
		"loftq_config":            map[string]any{},
		"lora_alpha":              pyNumber(o.Alpha),
		"lora_bias":               o.LoRABias,
		"lora_dropout":            json.Number("0.0"),
		"lora_ga_config":          nil,
		"megatron_config":         nil,
		"megatron_core":           "megatron.core",
		"modules_to_save":         nil,
		"monteclora_config":       nil,
		"peft_type":               "LORA",
		"peft_version":            "0.21.0",
		"qalora_group_size":       16,
		"r":                       o.R,
		"rank_pattern":            map[string]int{},
		"revision":                nil,
		"target_modules":          targetJSON,
		"target_parameters":       nil,
		"task_type":               "CAUSAL_LM",
		"trainable_token_indices": nil,
		"use_bdlora":              nil,
		"use_dora":                o.DoRA,
		"use_qalora":              false,
		"use_rslora":              o.RSLoRA,
		"velora_config":           nil,
	}
	if o.RankPattern != nil {
		cfg["rank_pattern"] = o.RankPattern
	}
	if o.LayersToTransform != nil {
		cfg["layers_to_transform"] = o.LayersToTransform
	}
	if o.LayersPattern != "" {
		cfg["layers_pattern"] = o.LayersPattern
	}
	if o.ModulesToSave != nil {
		cfg["modules_to_save"] = o.ModulesToSave
	}
	a.Config = cfg
	var b bytes.Buffer
	if err := jsonout.Write(&b, cfg); err != nil {
		return nil, err
	}
	// peft writes json.dumps(indent=2, sort_keys=True) with no final newline.
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, "adapter_config.json"), bytes.TrimRight(b.Bytes(), "\n"), 0o644); err != nil {
		return nil, err
	}
	return a, nil
}

func cutLast(n string) (string, string, bool) {
	i := strings.LastIndexByte(n, '.')
	if i < 0 {
		return "", "", false
	}
	return n[:i], n[i+1:], true
}

// saveMatch is PEFT's modules_to_save rule: the module name ends with an
// entry (on a dot boundary).
func saveMatch(keys []string, mod string) bool {
	for _, k := range keys {
		if mod == k || strings.HasSuffix(mod, "."+k) {
			return true
		}
	}
	return false
}

// pyNumber writes integral floats as ints, as Python's json does for an
// int lora_alpha.
func pyNumber(f float64) any {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f)
	}
	return f
}

func numberMap(m map[string]float64) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = pyNumber(v)
	}
	return out
}

// weightNorms returns the L2 norms (float64) of a [d0, d1] tensor's rows,
// or of its columns when perCol.
func weightNorms(s *baseSource, name string, d0, d1 int64, perCol bool) ([]float64, error) {
	n := d0
	if perCol {
		n = d1
	}
	acc := make([]float64, n)
	var row, col int64 // position of the next element
	err := s.chunks(name, func(v []float32) {
		for len(v) > 0 {
			k := min(int64(len(v)), d1-col) // the rest of this row
			if perCol {
				a := acc[col : col+k]
				for j, x := range v[:k] {
					a[j] += float64(x) * float64(x)
				}
			} else {
				// Added element by element into the row's sum, so the result
				// does not depend on how the values arrive in chunks.
				ss := acc[row]
				for _, x := range v[:k] {
					ss += float64(x) * float64(x)
				}
				acc[row] = ss
			}
			v = v[k:]
			col += k
			if col == d1 {
				col = 0
				row++
			}
		}
	})
	for k := range acc {
		acc[k] = math.Sqrt(acc[k])
	}
	return acc, err
}

func allValues(s *baseSource, name string) ([]float32, error) {
	var out []float32
	err := s.chunks(name, func(v []float32) { out = append(out, v...) })
	return out, err
}
