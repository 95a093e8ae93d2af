package testmodel

import "fmt"

// Hybrid holds the fields shared by the Gated-DeltaNet hybrid families
// (Qwen3.5 dense, Qwen3.5 MoE, Qwen3-Next). Zero values take defaults.
type Hybrid struct {
	// LayerTypes, one per layer, each "linear_attention" or
	// "full_attention". Default: every FullAttentionInterval-th layer is full
	// attention, the rest linear (the Qwen3.5 pattern).
	LayerTypes            []string
	FullAttentionInterval int // default 4

	LinearNumKeyHeads   int // default 2
	LinearNumValueHeads int // default 4
	LinearKeyHeadDim    int // default 16
	LinearValueHeadDim  int // default 16
	LinearConvKernelDim int // default 4

	PartialRotaryFactor float64 // default 0.25
	RopeTheta           float64 // default 1e7
	// MRopeSection (Qwen3.5 only) defaults to the rotary pairs split in
	// three, largest first ([6,5,5] for head_dim 128, [11,11,10] for 256).
	MRopeSection []int

	// MTPLayers is mtp_num_hidden_layers (default 1). NoMTP writes neither
	// the config key nor the tensors. OmitMTPTensors keeps the config key
	// but writes no mtp.* tensor (what a PEFT merge_and_unload save does).
	MTPLayers      int
	NoMTP          bool
	OmitMTPTensors bool
}

// MoE holds the mixture-of-experts fields (Qwen3.5 MoE, Qwen3-Next).
type MoE struct {
	NumExperts                   int // default 4
	NumExpertsPerTok             int // default 2
	MoEIntermediateSize          int // default 32
	SharedExpertIntermediateSize int // default 32
	// FusedExperts writes the transformers-v5 layout for the trunk:
	// mlp.experts.gate_up_proj [E, 2·I, H] and mlp.experts.down_proj
	// [E, H, I] (no .weight suffix) instead of per-expert tensors.
	FusedExperts bool
	// FusedMTPExperts does the same for the MTP layers (Qwen3.6 style).
	FusedMTPExperts bool
}

// Qwen35Options configures a Qwen3_5ForCausalLM checkpoint (model_type
// qwen3_5_text): Gated-DeltaNet linear-attention layers (in_proj_qkv,
// in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias, norm, out_proj)
// mixed with gated full-attention layers (q_proj rows 2·heads·head_dim), a
// dense MLP, and the 15 mtp.* tensors in the last shard.
type Qwen35Options struct {
	Common
	Hybrid
	// ConditionalGeneration writes the Qwen3_5ForConditionalGeneration
	// layout: tensors under model.language_model., config nested in
	// text_config (model_type qwen3_5); lm_head.weight and mtp.* stay at the
	// top level.
	ConditionalGeneration bool
	// Vision, when set, adds a vision tower (and implies
	// ConditionalGeneration): see Vision, and Qwen35VL for a whole set.
	Vision *Vision
}

// Qwen35MoEOptions configures a Qwen3_5MoeForCausalLM checkpoint
// (model_type qwen3_5_moe_text): as Qwen35Options, with every MLP (the MTP
// layers' too) a router mlp.gate, experts mlp.experts.{e}.{gate,up,down}_proj,
// a shared expert mlp.shared_expert.* and mlp.shared_expert_gate.
type Qwen35MoEOptions struct {
	Common
	Hybrid
	MoE
	ConditionalGeneration bool
	// Vision, when set, adds a vision tower (and implies
	// ConditionalGeneration): see Vision, and Qwen35MoEVL for a whole set.
	Vision *Vision
}

// Qwen3NextOptions configures a Qwen3NextForCausalLM checkpoint (model_type
// qwen3_next): the MoE hybrid with the fused linear-attention projections
// in_proj_qkvz [2·key_dim + 2·value_dim, H] and in_proj_ba [2·num_v_heads, H]
// (names as llama.cpp's Qwen3NextModel converter and vLLM read them). Its
// MTP count is written as mtp_num_hidden_layers, the key llama.cpp's
// _QwenMtpMixin reads; whether the released config carries it is not
// confirmed (notes/mlx.md).
type Qwen3NextOptions struct {
	Common
	Hybrid
	MoE
}

// Hybrid defaults: hidden 64, intermediate 128, 4 layers (3 linear + 1
// full), 2 attention heads of 32, 1 KV head, vocab 512.
var hybridDefaults = Common{
	VocabSize: 512, HiddenSize: 64, IntermediateSize: 128, NumLayers: 4,
	NumHeads: 2, NumKVHeads: 1, HeadDim: 32,
}

// Qwen35Reference has the dimensions of ../shared/reference/qwen35/base
// (hidden 256, head_dim 128, 3 linear + 1 full layers, linear heads 2×64 key
// and 4×64 value, vocab 512, 1 MB shards): its tensor names, shapes and
// shard assignment match the reference's.
func Qwen35Reference() Qwen35Options {
	return Qwen35Options{Common: Common{
		VocabSize: 512, HiddenSize: 256, IntermediateSize: 512, NumLayers: 4,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 128, MaxShardSize: 1_000_000,
	}, Hybrid: Hybrid{LinearKeyHeadDim: 64, LinearValueHeadDim: 64}}
}

// Large27B returns Qwen3.5-27B widths (hidden 5120, intermediate 17408, 24
// heads of 256, 4 KV heads, linear heads 16×128 key and 48×128 value) with
// the given layer count (a multiple of 4 keeps the 3:1 pattern), one MTP
// layer, BF16, 2 GB shards, and RepeatBlock set so writing costs about
// what the disk takes. The vocabulary is 248320 as in the real model (two
// 2.5 GB embedding matrices); lower VocabSize for a lighter benchmark. With
// 4 layers and vocab 248320 this is the anchors.md slice (8,987,134,515
// tensor bytes in the reference; see the package tests).
func Large27B(layers int) Qwen35Options {
	return Qwen35Options{Common: Common{
		VocabSize: 248320, HiddenSize: 5120, IntermediateSize: 17408, NumLayers: layers,
		NumHeads: 24, NumKVHeads: 4, HeadDim: 256, MaxShardSize: 2_000_000_000,
		RepeatBlock: 1 << 16, NoTokenizer: true,
	}, Hybrid: Hybrid{
		LinearNumKeyHeads: 16, LinearNumValueHeads: 48, LinearKeyHeadDim: 128, LinearValueHeadDim: 128,
	}}
}

// Write generates the checkpoint into dir.
func (o Qwen35Options) Write(dir string) (*Model, error) { return finish(dir)(o.build()) }

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen35Options) Layout() (*Model, error) { return finish("")(o.build()) }

func (o Qwen35Options) build() (*builder, error) {
	return buildHybrid(o.Common, o.Hybrid, nil, hybridQwen35, o.ConditionalGeneration, o.Vision)
}

// Write generates the checkpoint into dir.
func (o Qwen35MoEOptions) Write(dir string) (*Model, error) { return finish(dir)(o.build()) }

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen35MoEOptions) Layout() (*Model, error) { return finish("")(o.build()) }

func (o Qwen35MoEOptions) build() (*builder, error) {
	moe := o.MoE
	return buildHybrid(o.Common, o.Hybrid, &moe, hybridQwen35, o.ConditionalGeneration, o.Vision)
}

// Write generates the checkpoint into dir.
func (o Qwen3NextOptions) Write(dir string) (*Model, error) { return finish(dir)(o.build()) }

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen3NextOptions) Layout() (*Model, error) { return finish("")(o.build()) }

func (o Qwen3NextOptions) build() (*builder, error) {
	moe := o.MoE
	return buildHybrid(o.Common, o.Hybrid, &moe, hybridNext, false, nil)
}

type hybridKind int

const (
	hybridQwen35 hybridKind = iota
	hybridNext
)

func (h Hybrid) withDefaults(layers int) Hybrid {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&h.FullAttentionInterval, 4)
	def(&h.LinearNumKeyHeads, 2)
	def(&h.LinearNumValueHeads, 4)
	def(&h.LinearKeyHeadDim, 16)
	def(&h.LinearValueHeadDim, 16)
	def(&h.LinearConvKernelDim, 4)
	def(&h.MTPLayers, 1)
	if h.PartialRotaryFactor == 0 {
		h.PartialRotaryFactor = 0.25
	}
	if h.RopeTheta == 0 {
		h.RopeTheta = 1e7
	}
	if h.LayerTypes == nil {
		h.LayerTypes = make([]string, layers)
		for i := range h.LayerTypes {
			if (i+1)%h.FullAttentionInterval == 0 {
				h.LayerTypes[i] = "full_attention"
			} else {
				h.LayerTypes[i] = "linear_attention"
			}
		}
	}
	return h
}

func (m MoE) withDefaults() MoE {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&m.NumExperts, 4)
	def(&m.NumExpertsPerTok, 2)
	def(&m.MoEIntermediateSize, 32)
	def(&m.SharedExpertIntermediateSize, 32)
	return m
}

// mropeSection splits the rotary pairs in three, largest first.
func mropeSection(headDim int, prf float64) []int {
	pairs := int(float64(headDim)*prf) / 2
	a := (pairs + 2) / 3
	rest := pairs - a
	b := (rest + 1) / 2
	return []int{a, b, rest - b}
}

func buildHybrid(c Common, h Hybrid, moe *MoE, kind hybridKind, condGen bool, vision *Vision) (*builder, error) {
	c = c.withDefaults(hybridDefaults)
	var vis Vision
	if vision != nil {
		condGen = true
		vis = vision.withDefaults()
		if err := vis.check(); err != nil {
			return nil, err
		}
		c.extraTokens, c.padRows = VisionTokens, visionPadRows
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	h = h.withDefaults(c.NumLayers)
	if len(h.LayerTypes) != c.NumLayers {
		return nil, fmt.Errorf("testmodel: %d layer_types for %d layers", len(h.LayerTypes), c.NumLayers)
	}
	for i, t := range h.LayerTypes {
		if t != "linear_attention" && t != "full_attention" {
			return nil, fmt.Errorf("testmodel: layer_types[%d] = %q", i, t)
		}
	}
	if h.LinearNumValueHeads%h.LinearNumKeyHeads != 0 {
		return nil, fmt.Errorf("testmodel: linear value heads %d not a multiple of key heads %d", h.LinearNumValueHeads, h.LinearNumKeyHeads)
	}
	if moe != nil {
		m := moe.withDefaults()
		moe = &m
		if m.NumExpertsPerTok > m.NumExperts {
			return nil, fmt.Errorf("testmodel: %d experts per token of %d", m.NumExpertsPerTok, m.NumExperts)
		}
	}
	if h.MRopeSection == nil && kind == hybridQwen35 {
		h.MRopeSection = mropeSection(c.HeadDim, h.PartialRotaryFactor)
	}

	b := &builder{c: c, prefix: "model.", numLayers: c.NumLayers, layerTypes: h.LayerTypes}
	if condGen {
		b.prefix = "model.language_model."
	}
	H, I, V := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.VocabSize)
	hd := int64(c.HeadDim)
	nk, nv := int64(h.LinearNumKeyHeads), int64(h.LinearNumValueHeads)
	keyDim, valDim := nk*int64(h.LinearKeyHeadDim), nv*int64(h.LinearValueHeadDim)
	convDim := 2*keyDim + valDim

	fullAttn := func(add func(string, Init, ...int64), p string) {
		add(p+"self_attn.q_proj.weight", matInit, 2*int64(c.NumHeads)*hd, H)
		add(p+"self_attn.k_proj.weight", matInit, int64(c.NumKVHeads)*hd, H)
		add(p+"self_attn.v_proj.weight", matInit, int64(c.NumKVHeads)*hd, H)
		add(p+"self_attn.o_proj.weight", matInit, H, int64(c.NumHeads)*hd)
		add(p+"self_attn.q_norm.weight", zeroInit, hd)
		add(p+"self_attn.k_norm.weight", zeroInit, hd)
	}
	mlp := func(add func(string, Init, ...int64), p string, fused bool) {
		if moe == nil {
			add(p+"mlp.gate_proj.weight", matInit, I, H)
			add(p+"mlp.up_proj.weight", matInit, I, H)
			add(p+"mlp.down_proj.weight", matInit, H, I)
			return
		}
		E, Im, Is := int64(moe.NumExperts), int64(moe.MoEIntermediateSize), int64(moe.SharedExpertIntermediateSize)
		add(p+"mlp.gate.weight", matInit, E, H)
		if fused {
			add(p+"mlp.experts.gate_up_proj", matInit, E, 2*Im, H)
			add(p+"mlp.experts.down_proj", matInit, E, H, Im)
		} else {
			for e := int64(0); e < E; e++ {
				ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
				add(ep+"gate_proj.weight", matInit, Im, H)
				add(ep+"up_proj.weight", matInit, Im, H)
				add(ep+"down_proj.weight", matInit, H, Im)
			}
		}
		add(p+"mlp.shared_expert.gate_proj.weight", matInit, Is, H)
		add(p+"mlp.shared_expert.up_proj.weight", matInit, Is, H)
		add(p+"mlp.shared_expert.down_proj.weight", matInit, H, Is)
		add(p+"mlp.shared_expert_gate.weight", matInit, 1, H)
	}
	fusedTrunk := moe != nil && moe.FusedExperts
	fusedMTP := moe != nil && moe.FusedMTPExperts

	if vision != nil {
		b.addVision(vis, c.HiddenSize, moe != nil)
	}
	b.add(b.prefix+"embed_tokens.weight", matInit, V, H)
	for l, t := range h.LayerTypes {
		p := fmt.Sprintf("%slayers.%d.", b.prefix, l)
		if t == "linear_attention" {
			la := p + "linear_attn."
			// Module order as transformers registers it: own parameters
			// (dt_bias, A_log) first, then conv1d, norm, out_proj and the
			// input projections.
			b.add(la+"dt_bias", oneInit, nv)
			b.add(la+"A_log", Init{LogUniform, 0.1, 16}, nv)
			b.add(la+"conv1d.weight", matInit, convDim, 1, int64(h.LinearConvKernelDim))
			b.add(la+"norm.weight", oneInit, int64(h.LinearValueHeadDim))
			b.add(la+"out_proj.weight", matInit, H, valDim)
			if kind == hybridNext {
				b.add(la+"in_proj_qkvz.weight", matInit, 2*keyDim+2*valDim, H)
				b.add(la+"in_proj_ba.weight", matInit, 2*nv, H)
			} else {
				b.add(la+"in_proj_qkv.weight", matInit, convDim, H)
				b.add(la+"in_proj_z.weight", matInit, valDim, H)
				b.add(la+"in_proj_b.weight", matInit, nv, H)
				b.add(la+"in_proj_a.weight", matInit, nv, H)
			}
		} else {
			fullAttn(b.add, p)
		}
		mlp(b.add, p, fusedTrunk)
		b.add(p+"input_layernorm.weight", zeroInit, H)
		b.add(p+"post_attention_layernorm.weight", zeroInit, H)
	}
	b.add(b.prefix+"norm.weight", zeroInit, H)
	if !c.TieWordEmbeddings {
		b.add("lm_head.weight", matInit, V, H)
	}
	if !h.NoMTP {
		b.mtpLayers = h.MTPLayers
	}
	if !h.NoMTP && !h.OmitMTPTensors {
		// The real checkpoints' naming (reference PROVENANCE step 3):
		// mtp.fc, three norms, and mtp.layers.i as a full-attention block.
		b.addTail("mtp.fc.weight", matInit, H, 2*H)
		for i := 0; i < h.MTPLayers; i++ {
			p := fmt.Sprintf("mtp.layers.%d.", i)
			fullAttn(b.addTail, p)
			mlp(b.addTail, p, fusedMTP)
			b.addTail(p+"input_layernorm.weight", zeroInit, H)
			b.addTail(p+"post_attention_layernorm.weight", zeroInit, H)
		}
		b.addTail("mtp.norm.weight", zeroInit, H)
		b.addTail("mtp.pre_fc_norm_embedding.weight", zeroInit, H)
		b.addTail("mtp.pre_fc_norm_hidden.weight", zeroInit, H)
	}

	text := map[string]any{
		"attention_bias":          false,
		"attention_dropout":       0.0,
		"bos_token_id":            c.bosID(),
		"dtype":                   torchDType(c),
		"eos_token_id":            c.eosID(),
		"full_attention_interval": h.FullAttentionInterval,
		"head_dim":                c.HeadDim,
		"hidden_act":              "silu",
		"hidden_size":             c.HiddenSize,
		"initializer_range":       0.02,
		"layer_types":             h.LayerTypes,
		"linear_conv_kernel_dim":  h.LinearConvKernelDim,
		"linear_key_head_dim":     h.LinearKeyHeadDim,
		"linear_num_key_heads":    h.LinearNumKeyHeads,
		"linear_num_value_heads":  h.LinearNumValueHeads,
		"linear_value_head_dim":   h.LinearValueHeadDim,
		"max_position_embeddings": 4096,
		"num_attention_heads":     c.NumHeads,
		"num_hidden_layers":       c.NumLayers,
		"num_key_value_heads":     c.NumKVHeads,
		"pad_token_id":            c.bosID(),
		"partial_rotary_factor":   h.PartialRotaryFactor,
		"rms_norm_eps":            1e-6,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"transformers_version":    transformersVersion,
		"use_cache":               true,
		"vocab_size":              c.VocabSize,
	}
	rope := map[string]any{
		"partial_rotary_factor": h.PartialRotaryFactor,
		"rope_theta":            h.RopeTheta,
		"rope_type":             "default",
	}
	if kind == hybridQwen35 {
		rope["mrope_interleaved"] = true
		rope["mrope_section"] = h.MRopeSection
	}
	text["rope_parameters"] = rope
	if !h.NoMTP {
		text["mtp_num_hidden_layers"] = h.MTPLayers
		text["mtp_use_dedicated_embeddings"] = false
	}
	if moe == nil {
		text["intermediate_size"] = c.IntermediateSize
	} else {
		text["num_experts"] = moe.NumExperts
		text["num_experts_per_tok"] = moe.NumExpertsPerTok
		text["moe_intermediate_size"] = moe.MoEIntermediateSize
		text["shared_expert_intermediate_size"] = moe.SharedExpertIntermediateSize
		text["router_aux_loss_coef"] = 0.001
		text["output_router_logits"] = false
		// Qwen3NextConfig fields, which Qwen3_5MoeTextConfig inherits.
		text["decoder_sparse_step"] = 1
		text["mlp_only_layers"] = []int{}
		text["norm_topk_prob"] = true
	}
	switch {
	case kind == hybridNext:
		b.arch, b.modelType = "Qwen3NextForCausalLM", "qwen3_next"
		text["intermediate_size"] = c.IntermediateSize
	case moe != nil:
		b.arch, b.modelType = "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"
	default:
		b.arch, b.modelType = "Qwen3_5ForCausalLM", "qwen3_5_text"
	}
	text["model_type"] = b.modelType
	b.text = text
	if !condGen {
		text["architectures"] = []string{b.arch}
		b.config = text
	} else {
		outerType := "qwen3_5"
		b.arch = "Qwen3_5ForConditionalGeneration"
		if moe != nil {
			outerType = "qwen3_5_moe"
			b.arch = "Qwen3_5MoeForConditionalGeneration"
		}
		delete(text, "transformers_version")
		b.config = map[string]any{
			"architectures":        []string{b.arch},
			"model_type":           outerType,
			"text_config":          text,
			"tie_word_embeddings":  c.TieWordEmbeddings,
			"transformers_version": transformersVersion,
		}
		if vision != nil {
			// As transformers 5.17 saves Qwen3_5Config (the reference):
			// dtype at the top level only, the token ids of the vision
			// special tokens, which follow the ChatML ones.
			b.config["dtype"] = text["dtype"]
			delete(text, "dtype")
			b.config["vision_config"] = b.visionConfig
			first := c.bosID() + 3
			b.config["vision_start_token_id"] = first
			b.config["vision_end_token_id"] = first + 1
			b.config["image_token_id"] = first + 3
			b.config["video_token_id"] = first + 4
		}
	}
	return b, nil
}
