package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// The vision tower as a multimodal projector file (convert_hf_to_gguf.py
// --mmproj at 34af94c): conversion/base.py MmprojModel and
// conversion/qwen3vl.py Qwen3VLVisionModel, the class registered for
// Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration.
// The file is a GGUF of architecture "clip" and general.type "mmproj"
// holding the vision blocks (v.blk.N.*), the patch and position embeddings
// (v.patch_embd.*, v.position_embd.weight), the merger's norm (v.post_ln.*)
// and its two linear layers (mm.0.*, mm.2.*), and the clip.* keys llama.cpp's
// mtmd loader reads. It has no tokenizer and no text weights.

// Sentinel errors of an mmproj conversion (bad input, exit 2).
var (
	// ErrNoVision: the checkpoint has no vision tower to write.
	ErrNoVision = errors.New("no vision tower")
	// ErrPreprocessor: preprocessor_config.json (or processor_config.json)
	// is missing, unreadable, or lacks image_mean / image_std.
	ErrPreprocessor = errors.New("no usable image preprocessor config")
)

// mmprojClasses are the convert_hf_to_gguf.py --mmproj classes ferry
// writes; a family descriptor's GGUF.MMProjClass names the one for its
// vision-language layouts (internal/family: Qwen3_5ForConditionalGeneration
// and Qwen3_5MoeForConditionalGeneration are Qwen3VLVisionModel's, as in
// MMPROJ_MODEL_MAP).
var mmprojClasses = map[string]bool{"Qwen3VLVisionModel": true}

// mmprojLayout reports a vision-language layout whose family's --mmproj
// class ferry writes.
func mmprojLayout(f *desc.Family, l desc.Layout) bool {
	return l.Vision && f.GGUF != nil && mmprojClasses[f.GGUF.MMProjClass]
}

// qwen35VisionDefaults are transformers 5.17's Qwen3_5VisionConfig (and
// Qwen3_5MoeVisionConfig) defaults for the keys the converter reads: the
// converter loads config.json through AutoConfig, which fills a key the
// file leaves out with its default.
var qwen35VisionDefaults = []struct {
	key string
	val int64
}{
	{"depth", 27}, {"hidden_size", 1152}, {"intermediate_size", 4304}, {"num_heads", 16},
	{"patch_size", 16}, {"spatial_merge_size", 2}, {"temporal_patch_size", 2}, {"num_position_embeddings", 2304},
}

// Projector and KV constants (gguf-py constants.py).
const (
	mmprojArch          = "clip"
	projectorQwen3VL    = "qwen3vl_merger"
	preprocessorConfig  = "preprocessor_config.json"
	processorConfig     = "processor_config.json"
	maxPreprocessorJSON = 16 << 20
)

// HasVisionTower reports whether the checkpoint holds vision-tower tensors
// (under a family layout's tower prefix, model.visual.*, or an older
// layout's visual.*): what `gguf: { mmproj: auto }` writes an mmproj for.
func HasVisionTower(ck *safetensors.Checkpoint) bool {
	prefixes := append(desc.VisionTowers(), "visual.")
	for _, sh := range ck.Shards {
		for _, ti := range sh.Tensors {
			for _, p := range prefixes {
				if strings.HasPrefix(ti.Name, p) {
					return true
				}
			}
		}
	}
	return false
}

// MMProjSupported lists the architectures whose vision tower --mmproj
// writes.
func MMProjSupported() []string { return desc.Architectures(mmprojLayout) }

// vision is the converter state of one mmproj conversion.
type vision struct {
	m     *model
	vcfg  map[string]any // vision_config, with the transformers defaults filled in
	depth int64          // vision blocks (depth)
	// deepstack marks the blocks whose output a deepstack merger takes
	// (vision_config deepstack_visual_indexes; Qwen3.5 has none).
	deepstack []bool
	dsIndex   []int64
}

// newMMProjPlan plans the vision tower of ckpt as the converter's --mmproj
// writes it.
func newMMProjPlan(ckpt *safetensors.Checkpoint, opts Options) (*Plan, error) {
	cfg := ckpt.Config
	arch := cfg.Architecture()
	if opts.NoMTP || opts.MTPOnly {
		return nil, errf(ckpt.Dir, "", -1, ErrOptions, "--no-mtp and --mtp-only do not apply to --mmproj (the converter refuses them for its vision class too): an mmproj holds the vision tower only")
	}
	if opts.Pre != "" {
		return nil, errf(ckpt.Dir, "", -1, ErrOptions, "--pre does not apply to --mmproj: an mmproj has no tokenizer")
	}
	if f, l, ok := desc.ByArchitecture(arch); !ok || !mmprojLayout(f, l) {
		if _, err := writerFor(arch); err == nil {
			return nil, errf(cfg.Path, "", -1, ErrNoVision, "%s has no vision tower: architectures[0] is %q, a text-only model (--mmproj writes the vision tower of %s)",
				ckpt.Dir, arch, strings.Join(MMProjSupported(), ", "))
		}
		return nil, errf(cfg.Path, "", -1, ErrUnsupportedArch, "architectures[0] is %q; --mmproj supports %s", arch, strings.Join(MMProjSupported(), ", "))
	}
	m := &model{dir: ckpt.Dir, ckpt: ckpt, cfg: cfg, opts: opts, hfArch: arch}
	v := &vision{m: m}
	if err := v.setup(); err != nil {
		return nil, err
	}
	return v.plan()
}

func (v *vision) cfgErr(format string, args ...any) error {
	return errf(v.m.cfg.Path, "", -1, ErrConfig, format, args...)
}

// setup reads vision_config (MmprojModel.__init__ and
// Qwen3VLVisionModel.__init__) and indexes the vision tensors.
func (v *vision) setup() error {
	m := v.m
	raw, ok := m.cfg.Raw["vision_config"]
	if !ok || raw == nil {
		return errf(m.cfg.Path, "", -1, ErrNoVision, "%s has no vision tower: config.json has no vision_config (the converter: \"vision_config / audio_config not found in hparams\")", m.dir)
	}
	vc, ok := raw.(map[string]any)
	if !ok {
		return v.cfgErr("vision_config is %T, not an object", raw)
	}
	v.vcfg = map[string]any{}
	for k, x := range vc {
		v.vcfg[k] = x
	}
	for _, d := range qwen35VisionDefaults {
		if _, ok := v.vcfg[d.key]; !ok {
			v.vcfg[d.key] = json.Number(strconv.FormatInt(d.val, 10))
			m.warnings = append(m.warnings, fmt.Sprintf("config.json vision_config has no %s: using %d, transformers' Qwen3_5VisionConfig default, as the converter (which reads the config through AutoConfig) does", d.key, d.val))
		}
	}
	var err error
	if v.depth, err = v.posInt("depth"); err != nil {
		return err
	}
	if v.depth > 1<<12 {
		return v.cfgErr("vision_config depth %d is implausible", v.depth)
	}
	v.deepstack = make([]bool, v.depth)
	if ds, ok := v.vcfg["deepstack_visual_indexes"]; ok && ds != nil {
		list, ok := ds.([]any)
		if !ok {
			return v.cfgErr("vision_config deepstack_visual_indexes is %T, not a list", ds)
		}
		for _, x := range list {
			i, ok := jsonInt(x)
			if !ok || i < 0 || i >= v.depth {
				return v.cfgErr("vision_config deepstack_visual_indexes holds %v, not a block index below depth %d", x, v.depth)
			}
			v.deepstack[i] = true
			v.dsIndex = append(v.dsIndex, i)
		}
	}

	// The index: MmprojModel's filters over every tensor, in index order.
	seen := map[string]string{}
	err = indexOrder(m.ckpt, func(sh *safetensors.Shard, ti safetensors.TensorInfo) error {
		name, keep := visionFilter(ti.Name)
		if !keep {
			return nil
		}
		e, err := newInvEntry(seen, sh, ti, name)
		if err != nil {
			return err
		}
		m.inventory = append(m.inventory, e)
		return nil
	})
	if err != nil {
		return err
	}
	if len(m.inventory) == 0 {
		return errf(m.dir, "", -1, ErrNoVision, "%s has no vision tower: config.json has a vision_config but no shard holds a model.visual.* tensor", m.dir)
	}

	// --outtype auto: the first matrix that is BF16 or F16 decides, among
	// the vision tensors (ModelBase.__init__ scans get_tensors()).
	m.outType = m.opts.OutType
	if m.outType == OutAuto {
		m.outType = OutF16
		for _, e := range m.inventory {
			if len(e.shp) < 2 {
				continue
			}
			if e.src.DType == tensor.BF16 {
				m.outType = OutBF16
				break
			}
			if e.src.DType == tensor.F16 {
				break
			}
		}
	}
	if m.opts.Policy == nil {
		m.opts.Policy = MMProjPolicy
	}
	return nil
}

// posInt reads a positive integer of vision_config.
func (v *vision) posInt(key string) (int64, error) {
	x, ok := jsonInt(v.vcfg[key])
	if !ok || x <= 0 {
		return 0, v.cfgErr("vision_config %s is %v, want a positive integer", key, v.vcfg[key])
	}
	return x, nil
}

// visionFilter is Qwen3VLVisionModel.filter_tensors, then MmprojModel's and
// ModelBase's: the text model's lm_head and the MTP head are dropped,
// model.visual. becomes visual., and only visual.* is kept.
func visionFilter(name string) (string, bool) {
	if strings.HasPrefix(name, "lm_head.") || strings.HasPrefix(name, "mtp.") {
		return "", false
	}
	if rest, ok := strings.CutPrefix(name, "model.visual."); ok {
		name = "visual." + rest
	}
	if !strings.HasPrefix(name, "visual.") || strings.Contains(name, "language_model.") {
		return "", false
	}
	if strings.HasSuffix(name, "e_score_correction_bias") {
		name = strings.Replace(name, "e_score_correction_bias", "e_score_correction.bias", 1)
	}
	return name, true
}

// visionBlockNames are gguf-py's MMPROJ tensor map entries for the names a
// Qwen2-VL / Qwen3-VL / Qwen3.5 vision block has: HF name after
// visual.blocks.{bid}. → GGUF name after v.blk.{bid}.
var visionBlockNames = map[string]string{
	"attn.qkv":       "attn_qkv",
	"attn.q":         "attn_q",
	"attn.k":         "attn_k",
	"attn.v":         "attn_v",
	"attn.proj":      "attn_out",
	"norm1":          "ln1",
	"norm2":          "ln2",
	"mlp.fc1":        "ffn_up",
	"mlp.up_proj":    "ffn_up",
	"mlp.linear_fc1": "ffn_up",
	"mlp.gate_proj":  "ffn_gate",
	"mlp.fc2":        "ffn_down",
	"mlp.down_proj":  "ffn_down",
	"mlp.linear_fc2": "ffn_down",
	"attn.q_norm":    "attn_q_norm",
	"attn.k_norm":    "attn_k_norm",
	"attn.sinks":     "attn_sinks",
}

// mapName is TensorNameMap.get_name for the MMPROJ map with try_suffixes
// (.weight, .bias), restricted to the vision names above and
// visual.pos_embed; a block index must be below depth.
func (v *vision) mapName(name string) (string, error) {
	try := func(base string) (string, bool) {
		if base == "visual.pos_embed" {
			return "v.position_embd", true
		}
		rest, ok := strings.CutPrefix(base, "visual.blocks.")
		if !ok {
			return "", false
		}
		num, key, ok := strings.Cut(rest, ".")
		if !ok || !isDecimal(num) {
			return "", false
		}
		bid, err := strconv.ParseInt(num, 10, 64)
		if err != nil || bid >= v.depth {
			return "", false
		}
		stem := visionBlockNames[key]
		if stem == "" {
			return "", false
		}
		return fmt.Sprintf("v.blk.%d.%s", bid, stem), true
	}
	if out, ok := try(name); ok {
		return out, nil
	}
	for _, suf := range []string{".weight", ".bias"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if out, ok := try(base); ok {
				return out + suf, nil
			}
		}
	}
	return "", fmt.Errorf("%w %q for the clip vision tower (blocks 0..%d; the converter: \"Can not map tensor\")", ErrUnknownTensor, name, v.depth-1)
}

// modify is Qwen3VLVisionModel.modify_tensors.
func (v *vision) modify(t *vtensor) ([]*vtensor, error) {
	name := t.Name
	switch {
	case strings.HasPrefix(name, "visual.deepstack_merger_list."):
		parts := strings.SplitN(name, ".", 4)
		if len(parts) < 4 {
			return nil, fmt.Errorf("%w: unexpected deepstack tensor %q", ErrUnknownTensor, name)
		}
		i, err := strconv.Atoi(parts[2])
		if err != nil || i < 0 || i >= len(v.dsIndex) {
			return nil, fmt.Errorf("%w: %q: deepstack merger %s, but vision_config deepstack_visual_indexes has %d entries", ErrUnknownTensor, name, parts[2], len(v.dsIndex))
		}
		target := parts[3]
		var stem string
		switch {
		case strings.HasPrefix(target, "norm."):
			stem = "norm"
		case strings.HasPrefix(target, "linear_fc1."):
			stem = "fc1"
		case strings.HasPrefix(target, "linear_fc2."):
			stem = "fc2"
		default:
			return nil, fmt.Errorf("%w: unexpected deepstack tensor %q", ErrUnknownTensor, name)
		}
		_, suffix, _ := strings.Cut(target, ".")
		return []*vtensor{t.renamed(fmt.Sprintf("v.deepstack.%d.%s.%s", v.dsIndex[i], stem, suffix))}, nil
	case strings.HasPrefix(name, "visual.merger."):
		suffix := strings.SplitN(name, ".", 3)[2]
		switch {
		case strings.HasPrefix(suffix, "linear_fc"):
			idx, tail, ok := strings.Cut(suffix, ".")
			n, err := strconv.Atoi(strings.TrimPrefix(idx, "linear_fc"))
			if !ok || err != nil || (n != 1 && n != 2) {
				return nil, fmt.Errorf("%w: unexpected fc index in %q (the merger has linear_fc1 and linear_fc2)", ErrUnknownTensor, name)
			}
			return []*vtensor{t.renamed(fmt.Sprintf("mm.%d.%s", 2*(n-1), tail))}, nil
		case strings.HasPrefix(suffix, "norm."):
			return []*vtensor{t.renamed("v.post_ln." + strings.SplitN(suffix, ".", 2)[1])}, nil
		}
		return nil, fmt.Errorf("%w: unexpected merger tensor %q", ErrUnknownTensor, name)
	case name == "visual.patch_embed.proj.weight":
		// The Conv3d kernel [out, in, T, kh, kw] becomes two Conv2d
		// kernels, t = 0 and t = 1: output row (o, c, h) of the half t is
		// source row ((o·C + c)·T + t)·kh + h.
		if len(t.Shape) != 5 {
			return nil, fmt.Errorf("%w: %s is %v, want a 5-D Conv3d kernel [out, in, temporal, h, w]", ErrShape, name, t.Shape)
		}
		if T := t.Shape[2]; T != 2 {
			return nil, fmt.Errorf("%w: %s has temporal size %d; the converter supports only temporal_patch_size 2", ErrShape, name, T)
		}
		T, H := t.Shape[2], t.Shape[3]
		shape := []int64{t.Shape[0], t.Shape[1], t.Shape[3], t.Shape[4]}
		half := func(k int64, out string) *vtensor {
			return t.gatherRowsShape(shape, func(i int64) int64 { return ((i/H)*T+k)*H + i%H }, fmt.Sprintf("temporal slice %d", k)).renamed(out)
		}
		return []*vtensor{half(0, "v.patch_embd.weight"), half(1, "v.patch_embd.weight.1")}, nil
	case name == "visual.patch_embed.proj.bias":
		return []*vtensor{t.renamed("v.patch_embd.bias")}, nil
	}
	out, err := v.mapName(name)
	if err != nil {
		return nil, err
	}
	return []*vtensor{t.renamed(out)}, nil
}

var _ quant.Policy = MMProjPolicy

// MMProjPolicy is convert_hf_to_gguf.py's type choice for an mmproj
// (MmprojModel.tensor_force_quant, then ModelBase.prepare_tensors at
// 34af94c): the patch embedding (v.patch_embd.weight and .weight.1, any
// .patch_merger.weight) is F16 in an f16 file and F32 in every other; 1-D
// tensors, norms, v.position_embd.weight and any tensor whose name does not
// end in .weight stay F32; every other tensor gets the requested type, a
// quantized type whose blocks do not divide the row falling back to F16.
func MMProjPolicy(t quant.Tensor, want quant.Type) quant.Type {
	forcedPatch := strings.Contains(t.Name, ".patch_embd.weight") || strings.Contains(t.Name, ".patch_merger.weight")
	switch {
	case len(t.Dims) <= 1 || strings.HasSuffix(t.Name, "_norm.weight"):
		return quant.F32
	case forcedPatch && want == quant.F16:
		return quant.F16
	case forcedPatch:
		return quant.F32
	case t.Name == "v.position_embd.weight" || !hasWeightSuffix(t.Name):
		return quant.F32
	}
	if _, ok := want.RowSize(t.Dims[0]); !ok && want.BlockSize() > 1 {
		return quant.F16
	}
	return want
}

// plan maps every vision tensor and builds the header.
func (v *vision) plan() (*Plan, error) {
	m := v.m
	p := &Plan{Dir: m.dir, HFArch: m.hfArch, Arch: mmprojArch, OutType: m.outType, FileType: m.outType.fileType(), MMProj: true}
	if err := m.mapInventory(p, func(vt *vtensor, _ int) ([]*vtensor, error) { return v.modify(vt) }); err != nil {
		return nil, err
	}
	var kv kvList
	kv.add(gguf.Str("general.architecture", mmprojArch))
	kv.add(gguf.Str("general.type", "mmproj"))
	if err := m.generalKeys(&kv, p.Tensors); err != nil {
		return nil, err
	}
	if err := v.params(&kv); err != nil {
		return nil, err
	}
	kv.add(gguf.U32("general.quantization_version", 2)) // GGML_QNT_VERSION
	p.KVs = kv.list
	if err := m.seal(p); err != nil {
		return nil, err
	}
	return p, nil
}

// params is MmprojModel.set_gguf_parameters then
// Qwen3VLVisionModel.set_gguf_parameters, in their order.
func (v *vision) params(kv *kvList) error {
	m := v.m
	kv.add(gguf.U32("general.file_type", uint32(m.outType.fileType())))
	kv.add(gguf.Bool("clip.has_vision_encoder", true))
	nEmbd, ok := m.findInt("hidden_size", "n_embd")
	if !ok || nEmbd <= 0 {
		return v.cfgErr("the text model's hidden_size is missing or not positive (clip.vision.projection_dim is the text hidden size)")
	}
	kv.add(gguf.U32("clip.vision.projection_dim", uint32(nEmbd)))
	imageSize, err := v.imageSize()
	if err != nil {
		return err
	}
	kv.add(gguf.U32("clip.vision.image_size", imageSize))
	for _, f := range []struct{ key, src string }{
		{"clip.vision.patch_size", "patch_size"},
		{"clip.vision.embedding_length", "hidden_size"},
		{"clip.vision.feed_forward_length", "intermediate_size"},
		{"clip.vision.block_count", "depth"},
		{"clip.vision.attention.head_count", "num_heads"},
	} {
		x, err := v.posInt(f.src)
		if err != nil {
			return err
		}
		if x > math.MaxUint32 {
			return v.cfgErr("vision_config %s %d does not fit a UINT32", f.src, x)
		}
		kv.add(gguf.U32(f.key, uint32(x)))
	}
	pre, err := v.preprocessor()
	if err != nil {
		return err
	}
	for _, k := range []string{"image_mean", "image_std"} {
		a, err := preprocessorArray(m.dir, k, pre)
		if err != nil {
			return err
		}
		if a != nil {
			kv.add(*a)
		}
	}
	kv.add(gguf.Str("clip.projector_type", projectorQwen3VL))
	kv.add(gguf.Bool("clip.use_gelu", true))
	if ms, ok := v.vcfg["spatial_merge_size"]; ok && ms != nil {
		x, ok := jsonInt(ms)
		if !ok || x < 0 || x > math.MaxUint32 {
			return v.cfgErr("vision_config spatial_merge_size is %v, want a non-negative integer", ms)
		}
		kv.add(gguf.U32("clip.vision.spatial_merge_size", uint32(x)))
	}
	eps := 1e-6
	if tc, ok := m.cfg.Raw["text_config"].(map[string]any); ok {
		if x, ok := tc["rms_norm_eps"]; ok {
			if eps, ok = jsonFloat(x); !ok {
				return v.cfgErr("text_config rms_norm_eps is %v, not a number", x)
			}
		}
	}
	kv.add(gguf.F32("clip.vision.attention.layer_norm_epsilon", float32(eps)))
	if len(v.deepstack) > 0 {
		kv.add(gguf.KV{Key: "clip.vision.is_deepstack_layers", Type: gguf.ValueArray, Value: gguf.Array{Elem: gguf.ValueBool, Values: v.deepstack}})
	}
	return nil
}

// imageSize is vision_config image_size, or √num_position_embeddings ×
// patch_size truncated (Qwen3VLVisionModel.__init__).
func (v *vision) imageSize() (uint32, error) {
	if x, ok := v.vcfg["image_size"]; ok {
		n, ok := jsonInt(x)
		if !ok || n < 0 || n > math.MaxUint32 {
			return 0, v.cfgErr("vision_config image_size is %v, want a non-negative integer", x)
		}
		return uint32(n), nil
	}
	pos, err := v.posInt("num_position_embeddings")
	if err != nil {
		return 0, err
	}
	patch, err := v.posInt("patch_size")
	if err != nil {
		return 0, err
	}
	s := math.Trunc(math.Pow(float64(pos), 0.5) * float64(patch))
	if s > math.MaxUint32 {
		return 0, v.cfgErr("image size √%d × %d does not fit a UINT32", pos, patch)
	}
	return uint32(s), nil
}

// preprocessor is MmprojModel's preprocessor_config: preprocessor_config.json
// (its media_proc_cfg laid over it), then processor_config.json (its
// image_processor laid over it) laid over that. Neither file is an error
// here; the missing image_mean is (see preprocessorArray).
func (v *vision) preprocessor() (map[string]any, error) {
	out := map[string]any{}
	for _, f := range []struct{ name, nested string }{{preprocessorConfig, "media_proc_cfg"}, {processorConfig, "image_processor"}} {
		path := filepath.Join(v.m.dir, f.name)
		st, err := os.Stat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		if st.Size() > maxPreprocessorJSON {
			return nil, errf(path, "", -1, ErrPreprocessor, "%d bytes, over the %d-byte limit", st.Size(), maxPreprocessorJSON)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, errf(path, "", -1, ErrPreprocessor, "%v", err)
		}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber()
		var cfg map[string]any
		if err := dec.Decode(&cfg); err != nil || cfg == nil {
			return nil, errf(path, "", dec.InputOffset(), ErrPreprocessor, "not a JSON object: %v", err)
		}
		merged := map[string]any{}
		for k, x := range cfg {
			merged[k] = x
		}
		if inner, ok := cfg[f.nested].(map[string]any); ok {
			for k, x := range inner {
				merged[k] = x
			}
		}
		for k, x := range merged {
			out[k] = x
		}
	}
	return out, nil
}

// preprocessorArray is clip.vision.<key> from the preprocessor config as
// gguf-py's add_array writes a Python list: FLOAT32 elements for floats,
// INT32 for integers, BOOL for booleans, nothing for an empty list. A
// missing key is the converter's KeyError, said plainly.
func preprocessorArray(dir, key string, pre map[string]any) (*gguf.KV, error) {
	gkey := "clip.vision." + key
	x, ok := pre[key]
	if !ok {
		return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor,
			"no %s: %s writes it from %s (or processor_config.json's image_processor), and convert_hf_to_gguf.py --mmproj stops with KeyError: '%s' here too, it has no default. "+
				"Copy preprocessor_config.json from the base model (Qwen3.5's has image_mean and image_std [0.5, 0.5, 0.5])",
			key, gkey, preprocessorConfig, key)
	}
	list, ok := x.([]any)
	if !ok {
		return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor, "%s is %v, not a list of numbers", key, x)
	}
	if len(list) == 0 {
		return nil, nil
	}
	var (
		floats []float32
		ints   []int32
		bools  []bool
	)
	for _, e := range list {
		switch n := e.(type) {
		case json.Number:
			if strings.ContainsAny(n.String(), ".eE") { // a Python float
				f, err := n.Float64()
				if err != nil {
					return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor, "%s holds %v", key, n)
				}
				floats = append(floats, float32(f))
			} else {
				i, err := n.Int64()
				if err != nil || i < math.MinInt32 || i > math.MaxInt32 {
					return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor, "%s holds %v, outside INT32", key, n)
				}
				ints = append(ints, int32(i))
			}
		case bool:
			bools = append(bools, n)
		default:
			return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor, "%s holds %v (%T), not a number", key, e, e)
		}
	}
	var kv gguf.KV
	switch {
	case len(floats) == len(list):
		kv = gguf.KV{Key: gkey, Type: gguf.ValueArray, Value: gguf.Array{Elem: gguf.ValueFloat32, Values: floats}}
	case len(ints) == len(list):
		kv = gguf.KV{Key: gkey, Type: gguf.ValueArray, Value: gguf.Array{Elem: gguf.ValueInt32, Values: ints}}
	case len(bools) == len(list):
		kv = gguf.KV{Key: gkey, Type: gguf.ValueArray, Value: gguf.Array{Elem: gguf.ValueBool, Values: bools}}
	default:
		return nil, errf(filepath.Join(dir, preprocessorConfig), "", -1, ErrPreprocessor,
			"%s mixes integers and floats (%v): gguf-py refuses such an array (\"All items in a GGUF array should be of the same type\"); write them all as floats", key, list)
	}
	return &kv, nil
}
