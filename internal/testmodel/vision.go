package testmodel

import (
	"fmt"
	"math"
	"path/filepath"
)

// Vision configures the vision tower of a Qwen3.5 vision-language
// checkpoint (Qwen3_5ForConditionalGeneration /
// Qwen3_5MoeForConditionalGeneration), laid out as transformers 5.17 saves
// it and as ../shared/reference/qwen35vl/base holds it: model.visual.*
// first in state-dict order — patch_embed.proj (a Conv3d, weight
// [hidden, in_channels, temporal_patch, patch, patch], and bias),
// pos_embed [num_position_embeddings, hidden], per block norm1, norm2
// (LayerNorm weight and bias), attn.qkv [3·hidden, hidden], attn.proj,
// mlp.linear_fc1 [intermediate, hidden], mlp.linear_fc2 (each with a
// bias), then merger.norm [hidden], merger.linear_fc1 [hidden·m², hidden·m²]
// and merger.linear_fc2 [out_hidden, hidden·m²] (m the spatial merge size,
// out_hidden the text hidden size) — a vision_config, the image/video and
// vision start/end token ids, the five vision special tokens in the
// tokenizer (after the ChatML ones, then three padding rows, as the
// reference's 520-row vocabulary), and preprocessor_config.json.
// Zero fields take the defaults, the reference's.
type Vision struct {
	Depth                 int // default 2
	HiddenSize            int // default 64
	IntermediateSize      int // default 128
	NumHeads              int // default 2
	InChannels            int // default 3
	PatchSize             int // default 16
	SpatialMergeSize      int // default 2
	TemporalPatchSize     int // default 2
	NumPositionEmbeddings int // default 64 (a square number: the position grid is √n × √n)
}

// VisionTokens are the vision special tokens, in Qwen's order.
var VisionTokens = []string{"<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"}

// visionPadRows are the embedding rows past the tokenizer (the reference
// has 517 tokens and 520 rows).
const visionPadRows = 3

func (v Vision) withDefaults() Vision {
	def := func(x *int, d int) {
		if *x == 0 {
			*x = d
		}
	}
	def(&v.Depth, 2)
	def(&v.HiddenSize, 64)
	def(&v.IntermediateSize, 128)
	def(&v.NumHeads, 2)
	def(&v.InChannels, 3)
	def(&v.PatchSize, 16)
	def(&v.SpatialMergeSize, 2)
	def(&v.TemporalPatchSize, 2)
	def(&v.NumPositionEmbeddings, 64)
	return v
}

func (v Vision) check() error {
	for _, f := range []struct {
		n string
		v int
	}{{"Depth", v.Depth}, {"HiddenSize", v.HiddenSize}, {"IntermediateSize", v.IntermediateSize}, {"NumHeads", v.NumHeads},
		{"InChannels", v.InChannels}, {"PatchSize", v.PatchSize}, {"SpatialMergeSize", v.SpatialMergeSize},
		{"TemporalPatchSize", v.TemporalPatchSize}, {"NumPositionEmbeddings", v.NumPositionEmbeddings}} {
		if f.v <= 0 {
			return fmt.Errorf("testmodel: Vision.%s must be positive, got %d", f.n, f.v)
		}
	}
	if v.HiddenSize%v.NumHeads != 0 {
		return fmt.Errorf("testmodel: vision hidden %d is not a multiple of %d heads", v.HiddenSize, v.NumHeads)
	}
	if s := v.side(); s*s != v.NumPositionEmbeddings {
		return fmt.Errorf("testmodel: Vision.NumPositionEmbeddings %d is not a square", v.NumPositionEmbeddings)
	}
	return nil
}

func (v Vision) side() int { return int(math.Round(math.Sqrt(float64(v.NumPositionEmbeddings)))) }

// addVision adds the tower's tensors (they come first in state-dict order)
// and sets the builder's vision config, token ids and preprocessor.
func (b *builder) addVision(v Vision, textHidden int, moe bool) {
	H, I := int64(v.HiddenSize), int64(v.IntermediateSize)
	m2 := int64(v.SpatialMergeSize * v.SpatialMergeSize)
	p := "model.visual."
	b.add(p+"patch_embed.proj.weight", matInit, H, int64(v.InChannels), int64(v.TemporalPatchSize), int64(v.PatchSize), int64(v.PatchSize))
	b.add(p+"patch_embed.proj.bias", zeroInit, H)
	b.add(p+"pos_embed.weight", matInit, int64(v.NumPositionEmbeddings), H)
	for i := 0; i < v.Depth; i++ {
		bp := fmt.Sprintf("%sblocks.%d.", p, i)
		b.add(bp+"norm1.weight", oneInit, H)
		b.add(bp+"norm1.bias", zeroInit, H)
		b.add(bp+"norm2.weight", oneInit, H)
		b.add(bp+"norm2.bias", zeroInit, H)
		b.add(bp+"attn.qkv.weight", matInit, 3*H, H)
		b.add(bp+"attn.qkv.bias", zeroInit, 3*H)
		b.add(bp+"attn.proj.weight", matInit, H, H)
		b.add(bp+"attn.proj.bias", zeroInit, H)
		b.add(bp+"mlp.linear_fc1.weight", matInit, I, H)
		b.add(bp+"mlp.linear_fc1.bias", zeroInit, I)
		b.add(bp+"mlp.linear_fc2.weight", matInit, H, I)
		b.add(bp+"mlp.linear_fc2.bias", zeroInit, H)
	}
	b.add(p+"merger.norm.weight", oneInit, H)
	b.add(p+"merger.norm.bias", zeroInit, H)
	b.add(p+"merger.linear_fc1.weight", matInit, H*m2, H*m2)
	b.add(p+"merger.linear_fc1.bias", zeroInit, H*m2)
	b.add(p+"merger.linear_fc2.weight", matInit, int64(textHidden), H*m2)
	b.add(p+"merger.linear_fc2.bias", zeroInit, int64(textHidden))

	vtype := "qwen3_5_vision"
	if moe {
		vtype = "qwen3_5_moe_vision"
	}
	b.visionConfig = map[string]any{
		"depth":                   v.Depth,
		"hidden_act":              "gelu_pytorch_tanh",
		"hidden_size":             v.HiddenSize,
		"in_channels":             v.InChannels,
		"initializer_range":       0.02,
		"intermediate_size":       v.IntermediateSize,
		"model_type":              vtype,
		"num_heads":               v.NumHeads,
		"num_position_embeddings": v.NumPositionEmbeddings,
		"out_hidden_size":         textHidden,
		"patch_size":              v.PatchSize,
		"rope_parameters":         map[string]any{"rope_theta": 10000.0, "rope_type": "axial"},
		"spatial_merge_size":      v.SpatialMergeSize,
		"temporal_patch_size":     v.TemporalPatchSize,
	}
	image := v.side() * v.PatchSize
	edge := v.PatchSize * v.SpatialMergeSize
	b.preprocessor = map[string]any{
		"do_convert_rgb":       true,
		"do_normalize":         true,
		"do_rescale":           true,
		"do_resize":            true,
		"image_mean":           []float64{0.5, 0.5, 0.5},
		"image_processor_type": "Qwen2VLImageProcessorFast",
		"image_std":            []float64{0.5, 0.5, 0.5},
		"merge_size":           v.SpatialMergeSize,
		"patch_size":           v.PatchSize,
		"processor_class":      "Qwen3VLProcessor",
		"resample":             3,
		"rescale_factor":       0.00392156862745098,
		"size":                 map[string]any{"longest_edge": image * image, "shortest_edge": edge * edge},
		"temporal_patch_size":  v.TemporalPatchSize,
	}
}

// VLSet is a vision-language checkpoint and a PEFT DoRA adapter for its
// language model, as Qwen35VL and Qwen35MoEVL write them.
type VLSet struct {
	Dir        string
	Base       *Model   // Dir/base
	AdapterDir string   // Dir/adapter-dora
	Adapter    *Adapter // its modules and values
}

// VLAdapterRegex is the target_modules regex of the sets' DoRA adapters:
// the reference's (../shared/reference/qwen35vl/tools/make_vl.py RE_ALL12)
// — every attention, linear-attention and MLP projection of the language
// model, under model.language_model, so the adapter's keys are
// base_model.model.model.language_model.layers.N.… — with the MoE's shared
// expert in place of the dense MLP (routed experts are fused parameters
// in transformers 5, not Linear modules PEFT adapts).
const (
	vlAttn            = `self_attn\.(q_proj|k_proj|v_proj|o_proj)|linear_attn\.(in_proj_qkv|in_proj_z|in_proj_b|in_proj_a|out_proj)`
	VLAdapterRegex    = `model\.language_model\.layers\.\d+\.(` + vlAttn + `|mlp\.(gate_proj|up_proj|down_proj))`
	VLMoEAdapterRegex = `model\.language_model\.layers\.\d+\.(` + vlAttn + `|mlp\.shared_expert\.(gate_proj|up_proj|down_proj))`
)

// Qwen35VL writes a tiny Qwen3_5ForConditionalGeneration set into dir:
// base/ (o with a vision tower: o.Vision, or the defaults when nil) and
// adapter-dora/ (DoRA r 8, alpha 16, VLAdapterRegex, seed o.Seed+1), the
// layout of ../shared/reference/qwen35vl.
func Qwen35VL(dir string, o Qwen35Options) (*VLSet, error) {
	if o.Vision == nil {
		o.Vision = &Vision{}
	}
	m, err := o.Write(filepath.Join(dir, "base"))
	if err != nil {
		return nil, err
	}
	return writeVLAdapter(dir, m, o.Seed, VLAdapterRegex)
}

// Qwen35MoEVL writes a tiny Qwen3_5MoeForConditionalGeneration set into
// dir: base/ (o with a vision tower: o.Vision, or the defaults when nil;
// the language model under model.language_model, lm_head and the mtp.*
// head at the top level, text_config model_type qwen3_5_moe_text,
// vision_config qwen3_5_moe_vision, preprocessor_config.json, a tokenizer
// with the vision tokens) and adapter-dora/ (DoRA r 8, alpha 16,
// VLMoEAdapterRegex, seed o.Seed+1). Set o.MoE.FusedExperts for the
// layout transformers 5 saves and mlx-lm's qwen3_5_moe sanitize reads
// (mlp.experts.gate_up_proj / down_proj); FusedMTPExperts likewise for
// the head (Qwen3.6; Qwen3.5 ships the head's experts one by one).
//
// Example (what a whole-pipeline test starts from):
//
//	set, err := testmodel.Qwen35MoEVL(t.TempDir(), testmodel.Qwen35MoEOptions{
//		Common: testmodel.Common{Seed: 5}, MoE: testmodel.MoE{FusedExperts: true}})
//	// set.Base.Dir is the checkpoint, set.AdapterDir the adapter for it.
func Qwen35MoEVL(dir string, o Qwen35MoEOptions) (*VLSet, error) {
	if o.Vision == nil {
		o.Vision = &Vision{}
	}
	m, err := o.Write(filepath.Join(dir, "base"))
	if err != nil {
		return nil, err
	}
	return writeVLAdapter(dir, m, o.Seed, VLMoEAdapterRegex)
}

// Qwen35MoEVLDevice are the options of the MoE set mlx-lm 0.32.0
// converted and loaded on a device (mlxpack/testdata/qwen35vl_mlx): seed 5,
// fused experts, expert and shared-expert widths 64 so every expert matrix
// quantizes at group 64 (MLX's CPU backend runs float experts in float32
// only), the other dimensions the defaults.
var Qwen35MoEVLDevice = Qwen35MoEOptions{
	Common: Common{Seed: 5},
	MoE:    MoE{FusedExperts: true, MoEIntermediateSize: 64, SharedExpertIntermediateSize: 64},
}

func writeVLAdapter(dir string, m *Model, seed uint64, regex string) (*VLSet, error) {
	ad := filepath.Join(dir, "adapter-dora")
	a, err := AdapterOptions{Seed: seed + 1, R: 8, Alpha: 16, DoRA: true, TargetRegex: regex}.Write(ad, m)
	if err != nil {
		return nil, err
	}
	return &VLSet{Dir: dir, Base: m, AdapterDir: ad, Adapter: a}, nil
}
