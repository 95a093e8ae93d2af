package verify

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// wTensor is one tensor of a safetensors/MLX weight index: header facts
// only, plus where to read it for --deep.
type wTensor struct {
	name  string
	dtype tensor.DType
	shape []int64
	loc   safetensors.Location
	file  string // shard file name, for messages
}

// quantParams is an MLX quantization entry (config.json "quantization").
type quantParams struct {
	groupSize int64
	bits      int64
	mode      string
}

// weights is the whole weight index of a checkpoint or MLX directory.
type weights struct {
	byName map[string]*wTensor
	names  []string // sorted

	// MLX quantization: global parameters and per-module overrides (nil
	// entry: the module is explicitly not quantized).
	quant    *quantParams
	quantFor map[string]*quantParams
}

func newWeights(ts []*wTensor) *weights {
	w := &weights{byName: map[string]*wTensor{}}
	for _, t := range ts {
		w.byName[t.name] = t
		w.names = append(w.names, t.name)
	}
	sort.Strings(w.names)
	return w
}

func (w *weights) get(name string) (*wTensor, bool) {
	t, ok := w.byName[name]
	return t, ok
}

// withPrefix lists the names starting with p, sorted.
func (w *weights) withPrefix(p string) []string {
	i := sort.SearchStrings(w.names, p)
	var out []string
	for ; i < len(w.names) && strings.HasPrefix(w.names[i], p); i++ {
		out = append(out, w.names[i])
	}
	return out
}

// layerIndices returns the distinct N of names p+"N.…", sorted.
func (w *weights) layerIndices(p string) []int {
	seen := map[int]bool{}
	for _, n := range w.withPrefix(p) {
		rest := n[len(p):]
		dot := strings.IndexByte(rest, '.')
		if dot <= 0 {
			continue
		}
		i, err := strconv.Atoi(rest[:dot])
		if err != nil || i < 0 || strconv.Itoa(i) != rest[:dot] {
			continue
		}
		seen[i] = true
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

// quantFor returns the MLX quantization of module (a tensor name without
// ".weight"), following mlx-lm's loader: a per-module entry wins, else the
// global parameters apply to a module that has a .scales tensor.
func (w *weights) quantOf(module string) (*quantParams, bool) {
	if q, ok := w.quantFor[module]; ok {
		return q, q != nil
	}
	if w.quant == nil {
		return nil, false
	}
	return w.quant, true
}

// logical is a tensor's shape before MLX affine packing: a U32 weight with
// a .scales companion holds bits-bit values packed 32/bits to a U32, in
// groups of group_size sharing one scale (mlx.md §3). ok is false, with a
// problem, when the packing does not add up.
func (w *weights) logical(t *wTensor) (shape []int64, quantized bool, problem string) {
	if t.dtype != tensor.U32 || !strings.HasSuffix(t.name, ".weight") {
		return t.shape, false, ""
	}
	module := strings.TrimSuffix(t.name, ".weight")
	sc, ok := w.get(module + ".scales")
	if !ok {
		return t.shape, false, ""
	}
	q, ok := w.quantOf(module)
	if !ok {
		return t.shape, true, fmt.Sprintf("U32 weight with %s.scales but config.json has no quantization entry for it", module)
	}
	if len(t.shape) == 0 || len(sc.shape) != len(t.shape) {
		return t.shape, true, fmt.Sprintf("packed weight %v and scales %v differ in rank", t.shape, sc.shape)
	}
	in := sc.shape[len(sc.shape)-1] * q.groupSize
	shape = slices.Clone(t.shape)
	shape[len(shape)-1] = in
	if q.bits <= 0 || t.shape[len(t.shape)-1]*32 != in*q.bits {
		return shape, true, fmt.Sprintf("packed width %d does not hold %d %d-bit values (scales %v, group size %d)",
			t.shape[len(t.shape)-1], in, q.bits, sc.shape, q.groupSize)
	}
	if !slices.Equal(sc.shape[:len(sc.shape)-1], t.shape[:len(t.shape)-1]) {
		return shape, true, fmt.Sprintf("scales %v do not match packed weight %v", sc.shape, t.shape)
	}
	return shape, true, ""
}

// companionSuffixes are tensors that belong to a weight rather than being a
// module of their own: MLX affine scales/biases and the FP8 block scales of
// DeepSeek-style checkpoints.
var companionSuffixes = []string{".scales", ".biases", ".weight_scale_inv", ".weight_scale", ".input_scale"}

func companionOf(name string) (base string, ok bool) {
	for _, s := range companionSuffixes {
		if strings.HasSuffix(name, s) {
			return strings.TrimSuffix(name, s), true
		}
	}
	return "", false
}

// slot is one logical weight of a decoder layer. Expert weights in any of
// the three layouts in use (per expert, HF fused gate_up_proj, MLX
// switch_mlp) share one slot with shape [experts, out, in].
type slot struct {
	key       string
	names     []string // tensor names (full) that make it up
	shape     []int64  // logical
	dtype     tensor.DType
	quantized bool
	problems  []string
}

var (
	perExpertRE = regexp.MustCompile(`^mlp\.experts\.(\d+)\.(.+)$`)
	fusedRE     = regexp.MustCompile(`^mlp\.experts\.(gate_up_proj|down_proj)(\.weight)?$`)
	switchRE    = regexp.MustCompile(`^mlp\.switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$`)
)

// layerSlots groups the tensors under prefix (a layer, "model.layers.3.")
// into slots, leaving out names in skip (relative). Companion tensors are not
// slots. It returns what is missing: companions of quantized weights, and
// experts in a gap of a per-expert set.
func (w *weights) layerSlots(prefix string, skip map[string]bool) (slots map[string]*slot, missing []string) {
	slots = map[string]*slot{}
	type expertPart struct {
		idx  int
		name string
	}
	perExpert := map[string][]expertPart{}
	for _, name := range w.withPrefix(prefix) {
		rel := name[len(prefix):]
		if skip[rel] {
			continue
		}
		if _, ok := companionOf(rel); ok {
			continue
		}
		t := w.byName[name]
		missing = append(missing, w.missingCompanions(t)...)
		shape, q, problem := w.logical(t)
		add := func(key string, shape []int64) {
			s := &slot{key: key, names: []string{name}, shape: shape, dtype: t.dtype, quantized: q}
			if problem != "" {
				s.problems = append(s.problems, name+": "+problem)
			}
			slots[key] = s
		}
		if m := perExpertRE.FindStringSubmatch(rel); m != nil {
			i, _ := strconv.Atoi(m[1])
			key := "mlp.experts.*." + m[2]
			perExpert[key] = append(perExpert[key], expertPart{i, name})
			continue
		}
		if m := fusedRE.FindStringSubmatch(rel); m != nil && len(shape) == 3 {
			if m[1] == "down_proj" {
				add("mlp.experts.*.down_proj.weight", shape)
				continue
			}
			half := slices.Clone(shape)
			half[1] /= 2
			add("mlp.experts.*.gate_proj.weight", half)
			add("mlp.experts.*.up_proj.weight", slices.Clone(half))
			if shape[1]%2 != 0 {
				slots["mlp.experts.*.gate_proj.weight"].problems = append(slots["mlp.experts.*.gate_proj.weight"].problems,
					fmt.Sprintf("%s: fused gate_up_proj %v has an odd middle dimension", name, shape))
			}
			continue
		}
		if m := switchRE.FindStringSubmatch(rel); m != nil {
			add("mlp.experts.*."+m[1]+".weight", shape)
			continue
		}
		add(rel, shape)
	}
	for key, parts := range perExpert {
		sort.Slice(parts, func(i, j int) bool { return parts[i].idx < parts[j].idx })
		s := &slot{key: key}
		var inner []int64
		for _, p := range parts {
			t := w.byName[p.name]
			shape, q, problem := w.logical(t)
			if problem != "" {
				s.problems = append(s.problems, p.name+": "+problem)
			}
			s.names = append(s.names, p.name)
			if inner == nil {
				inner, s.dtype, s.quantized = shape, t.dtype, q
			} else if !slices.Equal(inner, shape) {
				s.problems = append(s.problems, fmt.Sprintf("%s: shape %v differs from expert %d's %v", p.name, shape, parts[0].idx, inner))
			}
		}
		n := parts[len(parts)-1].idx + 1
		for i, want := 0, 0; want < n; want++ {
			if i < len(parts) && parts[i].idx == want {
				i++
				continue
			}
			missing = append(missing, prefix+"mlp.experts."+strconv.Itoa(want)+strings.TrimPrefix(key, "mlp.experts.*"))
		}
		s.shape = append([]int64{int64(n)}, inner...)
		slots[key] = s
	}
	return slots, missing
}

// missingCompanions lists the companion tensors a quantized weight needs
// but lacks: an MLX U32 weight needs .scales (and .biases in affine mode).
func (w *weights) missingCompanions(t *wTensor) []string {
	if t.dtype != tensor.U32 || !strings.HasSuffix(t.name, ".weight") {
		return nil
	}
	module := strings.TrimSuffix(t.name, ".weight")
	q, ok := w.quantOf(module)
	if !ok && w.quant == nil {
		return nil // not an MLX directory: a U32 tensor is just U32
	}
	var out []string
	if _, ok := w.get(module + ".scales"); !ok {
		out = append(out, module+".scales")
	}
	mode := "affine"
	if q != nil && q.mode != "" {
		mode = q.mode
	}
	if _, ok := w.get(module + ".biases"); !ok && mode == "affine" {
		out = append(out, module+".biases")
	}
	return out
}

// expectedNames renders a template slot's tensor names under another layer
// prefix (used to name what is missing).
func expectedNames(s *slot, fromPrefix, toPrefix string) []string {
	out := make([]string, 0, len(s.names))
	for _, n := range s.names {
		out = append(out, toPrefix+strings.TrimPrefix(n, fromPrefix))
	}
	return out
}

// floatDType reports the dtypes any format may keep a head in unquantized.
func floatDType(d tensor.DType) bool {
	switch d {
	case tensor.F16, tensor.BF16, tensor.F32, tensor.F64:
		return true
	}
	return false
}
