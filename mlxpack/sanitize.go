package mlxpack

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// span is a byte range of one source tensor.
type span struct {
	loc     safetensors.Location
	off, n  int64
	dtype   tensor.DType
	srcName string
}

// mlxTensor is one tensor of mlx-lm's model after sanitize: its name, the
// source bytes that make it (row-major, concatenated in order: stacked
// experts are one span per expert, a split fused tensor one span per
// expert half), and what sanitize does to its values.
type mlxTensor struct {
	name  string
	dtype tensor.DType // source dtype (every span has it)
	shape []int64
	spans []span
	// shift: sanitize adds 1.0 in the source dtype (zero-centred norms).
	shift bool
	// mtp: part of the MTP head (mtp.* in the source).
	mtp bool
}

func (t *mlxTensor) size() int64 {
	return total(t.spans, func(s span) int64 { return s.n })
}

// whole is a span covering all of l.
func whole(l safetensors.Location) span {
	return span{loc: l, n: l.Info.Size(), dtype: l.Info.DType, srcName: l.Info.Name}
}

// weightSet is the python dict sanitize works on: names in the order the
// checkpoint holds them, each with its tensor.
type weightSet struct {
	order []string
	m     map[string]*mlxTensor
}

func (w *weightSet) get(name string) (*mlxTensor, bool) {
	t, ok := w.m[name]
	return t, ok
}

func (w *weightSet) pop(name string) (*mlxTensor, bool) {
	t, ok := w.m[name]
	if ok {
		delete(w.m, name)
	}
	return t, ok
}

func (w *weightSet) put(t *mlxTensor) {
	if _, ok := w.m[t.name]; !ok {
		w.order = append(w.order, t.name)
	}
	w.m[t.name] = t
}

// filter keeps the tensors keep accepts.
func (w *weightSet) filter(keep func(name string) bool) {
	for n := range w.m {
		if !keep(n) {
			delete(w.m, n)
		}
	}
}

// rename maps every name through f (sanitize's prefix rewrites).
func (w *weightSet) rename(f func(string) (string, bool)) {
	nm := make(map[string]*mlxTensor, len(w.m))
	var order []string
	for _, n := range w.order {
		t, ok := w.m[n]
		if !ok {
			continue
		}
		nn, keep := f(n)
		if !keep {
			continue
		}
		t.name = nn
		nm[nn] = t
		order = append(order, nn)
	}
	w.m, w.order = nm, order
}

// names lists the names still present, in insertion order.
func (w *weightSet) names() []string {
	out := make([]string, 0, len(w.m))
	seen := map[string]bool{}
	for _, n := range w.order {
		if _, ok := w.m[n]; ok && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// sanitizeCtx is what a family's sanitize reads besides the weights.
type sanitizeCtx struct {
	cfg      *safetensors.Config
	keepMTP  bool
	tied     bool
	layers   int64
	experts  int64
	cfgPath  string
	dropped  []string // mtp.* names dropped (for the report)
	mtpShift bool     // shift the kept head's norms (MLX layout written)
}

var zeroCentredNorms = []string{
	".input_layernorm.weight",
	".post_attention_layernorm.weight",
	"model.norm.weight",
	".q_norm.weight",
	".k_norm.weight",
}

// The MTP head's own norms (mlx-lm PR #990 shifts them too).
var mtpNorms = []string{
	".pre_fc_norm_hidden.weight",
	".pre_fc_norm_embedding.weight",
	"mtp.norm.weight",
}

func isNormToShift(name string, mtp bool) bool {
	for _, s := range zeroCentredNorms {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	if mtp {
		for _, s := range mtpNorms {
			if strings.HasSuffix(name, s) {
				return true
			}
		}
	}
	return false
}

// dropMTP removes every name containing "mtp." (mlx-lm's rule) unless the
// head is kept.
func (c *sanitizeCtx) dropMTP(w *weightSet) {
	for _, n := range w.names() {
		if strings.Contains(n, "mtp.") {
			if c.keepMTP {
				w.m[n].mtp = true
				continue
			}
			c.dropped = append(c.dropped, n)
			delete(w.m, n)
		}
	}
}

func (c *sanitizeCtx) dropTiedHead(w *weightSet, name string) {
	if c.tied {
		w.pop(name)
	}
}

// stackExperts replaces <prefix>.experts.{0..E-1}.<n>.weight by
// <prefix>.switch_mlp.<n>.weight [E, ...] (qwen3_moe, qwen3_next).
func (c *sanitizeCtx) stackExperts(w *weightSet, prefix string, n string, optional bool) error {
	first := fmt.Sprintf("%s.experts.0.%s.weight", prefix, n)
	t0, ok := w.get(first)
	if !ok {
		if optional {
			return nil
		}
		return errf(c.cfgPath, first, ErrSanitize, "mlx-lm's sanitize stacks %d experts of %s but expert 0 is missing", c.experts, prefix)
	}
	st := &mlxTensor{name: fmt.Sprintf("%s.switch_mlp.%s.weight", prefix, n), dtype: t0.dtype, shape: append([]int64{c.experts}, t0.shape...), mtp: t0.mtp}
	for e := int64(0); e < c.experts; e++ {
		name := fmt.Sprintf("%s.experts.%d.%s.weight", prefix, e, n)
		t, ok := w.pop(name)
		if !ok {
			return errf(c.cfgPath, name, ErrSanitize, "missing: mlx-lm's sanitize stacks experts 0…%d (num_experts)", c.experts-1)
		}
		if t.dtype != t0.dtype || !slices.Equal(t.shape, t0.shape) {
			return errf(c.cfgPath, name, ErrSanitize, "%s %v, but expert 0 is %s %v: experts stack into one tensor", t.dtype, t.shape, t0.dtype, t0.shape)
		}
		st.spans = append(st.spans, t.spans...)
	}
	w.put(st)
	return nil
}

// splitFusedExperts splits <prefix>.experts.gate_up_proj [E, 2I, H] into
// switch_mlp.gate_proj / up_proj [E, I, H] and renames experts.down_proj
// (qwen3_5_moe).
func (c *sanitizeCtx) splitFusedExperts(w *weightSet, prefix string) error {
	gu, ok := w.pop(prefix + ".experts.gate_up_proj")
	if !ok {
		return nil
	}
	if len(gu.shape) != 3 || gu.shape[1]%2 != 0 || len(gu.spans) != 1 {
		return errf(c.cfgPath, prefix+".experts.gate_up_proj", ErrSanitize, "shape %v: want [experts, 2·intermediate, hidden]", gu.shape)
	}
	E, I2, H := gu.shape[0], gu.shape[1], gu.shape[2]
	mid := I2 / 2
	row := H * int64(gu.dtype.Bits()/8)
	sp := gu.spans[0]
	for half, name := range []string{"gate_proj", "up_proj"} {
		t := &mlxTensor{name: prefix + ".switch_mlp." + name + ".weight", dtype: gu.dtype, shape: []int64{E, mid, H}, mtp: gu.mtp}
		for e := int64(0); e < E; e++ {
			t.spans = append(t.spans, span{loc: sp.loc, off: sp.off + (e*I2+int64(half)*mid)*row, n: mid * row, dtype: sp.dtype, srcName: sp.srcName})
		}
		w.put(t)
	}
	if d, ok := w.pop(prefix + ".experts.down_proj"); ok {
		d.name = prefix + ".switch_mlp.down_proj.weight"
		w.put(d)
	}
	return nil
}

// convertFamily is what mlx quantize knows of one mlx-lm model type: its
// descriptor's MLX part (internal/family) with its sanitize resolved.
type convertFamily struct {
	// sanitize applies mlx-lm's Model.sanitize to w.
	sanitize func(c *sanitizeCtx, w *weightSet) error
	// layerOrder is the order a decoder layer's modules are defined in
	// mlx-lm's class, which is the order save_model writes them.
	layerOrder []string
	// keepDType: path suffixes of the parameters the model's
	// cast_predicate keeps in their source dtype.
	keepDType []string
	// mtpPrefix is where the kept MTP head goes after sanitize ("" when
	// the family has no MTP head).
	mtpPrefix string
}

// sanitizers resolves a descriptor's MLX.Sanitize: mlx-lm's Model.sanitize
// of each model. A family whose sanitize is new adds its function here;
// one that shares another's only names it in its descriptor.
var sanitizers = map[string]func(c *sanitizeCtx, w *weightSet) error{
	"simple":      simpleSanitize,
	"qwen3_moe":   qwen3MoESanitize,
	"qwen3_next":  qwen3NextSanitize,
	"qwen3_5":     qwen35Sanitize,
	"qwen3_5_moe": qwen35MoESanitize,
}

// convertFamilyOf is what mlx quantize does with a model type (as mlx-lm
// loads it, after FixedConfig's rewrite): false when no family descriptor
// names a sanitize ferry has for it.
func convertFamilyOf(modelType string) (convertFamily, bool) {
	f, ok := desc.ByMLXModelType(modelType)
	if !ok {
		return convertFamily{}, false
	}
	s, ok := sanitizers[f.MLX.Sanitize]
	if !ok {
		return convertFamily{}, false
	}
	return convertFamily{sanitize: s, layerOrder: f.MLX.LayerOrder, keepDType: f.MLX.KeepDType, mtpPrefix: f.MTP.MLXPrefix}, true
}

func simpleSanitize(c *sanitizeCtx, w *weightSet) error {
	w.filter(func(n string) bool { return !strings.Contains(n, "self_attn.rotary_emb.inv_freq") })
	c.dropTiedHead(w, "lm_head.weight")
	return nil
}

func qwen3MoESanitize(c *sanitizeCtx, w *weightSet) error {
	c.dropTiedHead(w, "lm_head.weight")
	if _, ok := w.get("model.layers.0.mlp.experts.0.up_proj.weight"); !ok {
		return nil
	}
	for l := int64(0); l < c.layers; l++ {
		for _, n := range []string{"up_proj", "down_proj", "gate_proj"} {
			if err := c.stackExperts(w, fmt.Sprintf("model.layers.%d.mlp", l), n, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// hybridNorms moves conv1d to MLX layout ([C,1,K] → [C,K,1]: the same
// bytes, the kernel axis last is a size-1 axis) and marks the zero-centred
// norms for the +1 shift when shift is set.
func hybridNorms(c *sanitizeCtx, w *weightSet, shift bool) {
	for _, n := range w.names() {
		t := w.m[n]
		if strings.Contains(n, "conv1d.weight") && len(t.shape) == 3 && t.shape[2] != 1 {
			t.shape = []int64{t.shape[0], t.shape[2], t.shape[1]}
		}
		if shift && len(t.shape) == 1 && isNormToShift(n, t.mtp && c.mtpShift) {
			t.shift = true
		}
	}
}

func qwen3NextSanitize(c *sanitizeCtx, w *weightSet) error {
	if _, ok := w.get("model.layers.0.mlp.experts.0.up_proj.weight"); !ok {
		return errf(c.cfgPath, "", ErrSanitize, "no model.layers.0.mlp.experts.0.up_proj.weight: mlx-lm's qwen3_next sanitize then leaves every name as it is (an already-converted checkpoint); converting it again is not supported")
	}
	c.dropMTP(w)
	c.dropTiedHead(w, "lm_head.weight")
	for l := int64(0); l < c.layers; l++ {
		for _, n := range []string{"up_proj", "down_proj", "gate_proj"} {
			if err := c.stackExperts(w, fmt.Sprintf("model.layers.%d.mlp", l), n, false); err != nil {
				return err
			}
		}
	}
	hybridNorms(c, w, true)
	return nil
}

// qwen35Rename is Qwen3.5's outer sanitize: vision weights dropped,
// model.language_model.* → language_model.model.*, everything else under
// language_model.
func qwen35Rename(w *weightSet) {
	w.rename(func(k string) (string, bool) {
		switch {
		case strings.HasPrefix(k, "vision_tower"), strings.HasPrefix(k, "model.visual"):
			return "", false
		case strings.HasPrefix(k, desc.HFLanguageModel):
			return desc.MLXQwen35Trunk + strings.TrimPrefix(k, desc.HFLanguageModel), true
		case strings.HasPrefix(k, "language_model."):
			return k, true
		}
		return "language_model." + k, true
	})
}

// qwen35TextSanitize is TextModel.sanitize: the +1 norm shift happens only
// when conv1d is still in HF layout.
func qwen35TextSanitize(c *sanitizeCtx, w *weightSet) error {
	unsanitized := false
	for _, n := range w.names() {
		t := w.m[n]
		if strings.Contains(n, "conv1d.weight") && len(t.shape) > 0 && t.shape[len(t.shape)-1] != 1 {
			unsanitized = true
		}
	}
	c.dropMTP(w)
	c.dropTiedHead(w, "language_model.lm_head.weight")
	hybridNorms(c, w, unsanitized)
	return nil
}

func qwen35Sanitize(c *sanitizeCtx, w *weightSet) error {
	qwen35Rename(w)
	return qwen35TextSanitize(c, w)
}

func qwen35MoESanitize(c *sanitizeCtx, w *weightSet) error {
	qwen35Rename(w)
	for l := int64(0); l < c.layers; l++ {
		prefix := fmt.Sprintf("language_model.model.layers.%d.mlp", l)
		if err := c.splitFusedExperts(w, prefix); err != nil {
			return err
		}
		// Per-expert tensors (transformers 5 saves the fused layout):
		// mlx-lm's sanitize leaves them as they are, which its model
		// refuses at load; ferry stacks them into switch_mlp as it does
		// for qwen3_moe, so the output loads.
		for _, n := range []string{"up_proj", "down_proj", "gate_proj"} {
			if err := c.stackExperts(w, prefix, n, true); err != nil {
				return err
			}
		}
	}
	if c.keepMTP {
		// The head's experts: fused (Qwen3.6) or per expert (Qwen3.5),
		// stacked as mlx-lm PR #990 does.
		for _, n := range w.names() {
			if p, ok := strings.CutSuffix(n, ".experts.gate_up_proj"); ok && strings.Contains(p, "mtp.") {
				if err := c.splitFusedExperts(w, p); err != nil {
					return err
				}
			}
		}
		for _, n := range w.names() {
			if p, ok := strings.CutSuffix(n, ".experts.0.up_proj.weight"); ok && strings.Contains(p, "mtp.") {
				for _, proj := range []string{"up_proj", "down_proj", "gate_proj"} {
					if err := c.stackExperts(w, p, proj, false); err != nil {
						return err
					}
				}
			}
		}
	}
	return qwen35TextSanitize(c, w)
}

// SupportedFamilies lists the model types mlx quantize converts: every
// model type, alias and remapped type of a family descriptor whose
// sanitize ferry has.
func SupportedFamilies() []string {
	return desc.MLXModelTypes(func(m *desc.MLX) bool { return sanitizers[m.Sanitize] != nil })
}

// moduleOrder ranks the children of a module by the order mlx-lm's classes
// define them (so tree_flatten(model.parameters()) order); later entries
// of a list come later, names not listed go last, alphabetically.
var moduleOrder = map[string][]string{
	"":               {"language_model", "model", "lm_head", "mtp"},
	"language_model": {"model", "lm_head", "mtp"},
	"model":          {"embed_tokens", "layers", "norm"},
	"self_attn":      {"q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"},
	"linear_attn":    {"conv1d", "in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "dt_bias", "A_log", "norm", "out_proj"},
	"mlp":            {"gate", "gate_proj", "down_proj", "up_proj", "switch_mlp", "shared_expert", "shared_expert_gate"},
	"switch_mlp":     {"gate_proj", "up_proj", "down_proj"},
	"shared_expert":  {"gate_proj", "down_proj", "up_proj"},
	"mtp":            {"pre_fc_norm_hidden", "pre_fc_norm_embedding", "fc", "layers", "norm"},
	// A leaf module's parameters: QuantizedLinear sets weight, scales,
	// biases, then bias.
	"*leaf": {"weight", "scales", "biases", "bias"},
}

var digitsRE = regexp.MustCompile(`^\d+$`)

// orderKey is a name's position in mlx-lm's parameter tree: per path
// component its rank among its siblings.
func orderKey(name string, layerOrder []string) []string {
	parts := strings.Split(name, ".")
	key := make([]string, len(parts))
	parent := ""
	for i, p := range parts {
		list := moduleOrder[parent]
		if digitsRE.MatchString(parent) {
			list = layerOrder
		}
		if i == len(parts)-1 && !slices.Contains(list, p) {
			list = moduleOrder["*leaf"]
		}
		r := -1
		for k, s := range list {
			if s == p {
				r = k
				break
			}
		}
		switch {
		case digitsRE.MatchString(p):
			n, _ := strconv.Atoi(p)
			key[i] = fmt.Sprintf("0%012d", n)
		case r >= 0:
			key[i] = fmt.Sprintf("0%012d", r)
		default:
			key[i] = "1" + p
		}
		parent = p
	}
	return key
}

// sortParams puts names in mlx-lm's save order.
func sortParams(names []string, layerOrder []string) {
	keys := make(map[string][]string, len(names))
	for _, n := range names {
		keys[n] = orderKey(n, layerOrder)
	}
	sort.SliceStable(names, func(i, j int) bool {
		a, b := keys[names[i]], keys[names[j]]
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] < b[k]
			}
		}
		return len(a) < len(b)
	})
}
