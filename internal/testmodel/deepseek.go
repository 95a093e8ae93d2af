package testmodel

import "fmt"

// DeepSeekV3Options configures a tiny DeepseekV3ForCausalLM checkpoint
// (model_type deepseek_v3) with MLA attention, MoE layers after
// FirstKDenseReplace dense ones, and NextN MTP layers stored the DeepSeek
// way: model.layers.{N+i}.* (N = num_hidden_layers) holding a full decoder
// block plus embed_tokens, enorm, hnorm, eh_proj [H, 2H], shared_head.norm
// and shared_head.head, declared by num_nextn_predict_layers. Names follow
// vLLM's deepseek_mtp.py (notes/mlx.md §5). Zero fields take defaults.
type DeepSeekV3Options struct {
	Common
	NumRoutedExperts    int // n_routed_experts, default 4
	NumSharedExperts    int // n_shared_experts, default 1
	NumExpertsPerTok    int // default 2
	MoEIntermediateSize int // default 32
	FirstKDenseReplace  int // default 1
	QLoraRank           int // default 32
	KVLoraRank          int // default 16
	QKNopeHeadDim       int // default 16
	QKRopeHeadDim       int // default 8
	VHeadDim            int // default 16
	// NextNLayers is num_nextn_predict_layers (default 1); NoNextN writes
	// neither the key nor the layers.
	NextNLayers int
	NoNextN     bool
}

// Write generates the checkpoint into dir.
func (o DeepSeekV3Options) Write(dir string) (*Model, error) { return finish(dir)(o.build()) }

// Layout returns the Model Write would produce, writing nothing.
func (o DeepSeekV3Options) Layout() (*Model, error) { return finish("")(o.build()) }

func (o DeepSeekV3Options) build() (*builder, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.NumRoutedExperts, 4)
	def(&o.NumSharedExperts, 1)
	def(&o.NumExpertsPerTok, 2)
	def(&o.MoEIntermediateSize, 32)
	def(&o.FirstKDenseReplace, 1)
	def(&o.QLoraRank, 32)
	def(&o.KVLoraRank, 16)
	def(&o.QKNopeHeadDim, 16)
	def(&o.QKRopeHeadDim, 8)
	def(&o.VHeadDim, 16)
	def(&o.NextNLayers, 1)
	if o.NoNextN {
		o.NextNLayers = 0
	}
	c := o.Common
	if c.NumKVHeads == 0 {
		c.NumKVHeads = c.NumHeads
	}
	c.HeadDim = o.QKNopeHeadDim + o.QKRopeHeadDim
	c = c.withDefaults(Common{VocabSize: 512, HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 2, NumKVHeads: 2})
	if err := c.check(); err != nil {
		return nil, err
	}
	if o.NumExpertsPerTok > o.NumRoutedExperts {
		return nil, fmt.Errorf("testmodel: %d experts per token of %d", o.NumExpertsPerTok, o.NumRoutedExperts)
	}
	b := &builder{c: c, prefix: "model.", numLayers: c.NumLayers, mtpLayers: o.NextNLayers,
		arch: "DeepseekV3ForCausalLM", modelType: "deepseek_v3"}
	H, I, V := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.VocabSize)
	nh := int64(c.NumHeads)
	E, Im := int64(o.NumRoutedExperts), int64(o.MoEIntermediateSize)
	qk := int64(o.QKNopeHeadDim + o.QKRopeHeadDim)

	layer := func(add func(string, Init, ...int64), l int) {
		p := fmt.Sprintf("model.layers.%d.", l)
		a := p + "self_attn."
		add(a+"q_a_proj.weight", matInit, int64(o.QLoraRank), H)
		add(a+"q_a_layernorm.weight", oneInit, int64(o.QLoraRank))
		add(a+"q_b_proj.weight", matInit, nh*qk, int64(o.QLoraRank))
		add(a+"kv_a_proj_with_mqa.weight", matInit, int64(o.KVLoraRank+o.QKRopeHeadDim), H)
		add(a+"kv_a_layernorm.weight", oneInit, int64(o.KVLoraRank))
		add(a+"kv_b_proj.weight", matInit, nh*int64(o.QKNopeHeadDim+o.VHeadDim), int64(o.KVLoraRank))
		add(a+"o_proj.weight", matInit, H, nh*int64(o.VHeadDim))
		if l < o.FirstKDenseReplace {
			add(p+"mlp.gate_proj.weight", matInit, I, H)
			add(p+"mlp.up_proj.weight", matInit, I, H)
			add(p+"mlp.down_proj.weight", matInit, H, I)
		} else {
			add(p+"mlp.gate.weight", matInit, E, H)
			add(p+"mlp.gate.e_score_correction_bias", zeroInit, E)
			for e := int64(0); e < E; e++ {
				ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
				add(ep+"gate_proj.weight", matInit, Im, H)
				add(ep+"up_proj.weight", matInit, Im, H)
				add(ep+"down_proj.weight", matInit, H, Im)
			}
			Is := Im * int64(o.NumSharedExperts)
			add(p+"mlp.shared_experts.gate_proj.weight", matInit, Is, H)
			add(p+"mlp.shared_experts.up_proj.weight", matInit, Is, H)
			add(p+"mlp.shared_experts.down_proj.weight", matInit, H, Is)
		}
		add(p+"input_layernorm.weight", oneInit, H)
		add(p+"post_attention_layernorm.weight", oneInit, H)
	}

	b.add("model.embed_tokens.weight", matInit, V, H)
	for l := 0; l < c.NumLayers; l++ {
		layer(b.add, l)
	}
	b.add("model.norm.weight", oneInit, H)
	if !c.TieWordEmbeddings {
		b.add("lm_head.weight", matInit, V, H)
	}
	for i := 0; i < o.NextNLayers; i++ {
		l := c.NumLayers + i
		p := fmt.Sprintf("model.layers.%d.", l)
		b.addTail(p+"embed_tokens.weight", matInit, V, H)
		b.addTail(p+"enorm.weight", oneInit, H)
		b.addTail(p+"hnorm.weight", oneInit, H)
		b.addTail(p+"eh_proj.weight", matInit, H, 2*H)
		layer(b.addTail, l)
		b.addTail(p+"shared_head.norm.weight", oneInit, H)
		b.addTail(p+"shared_head.head.weight", matInit, V, H)
	}

	cfg := map[string]any{
		"architectures":           []string{b.arch},
		"attention_bias":          false,
		"attention_dropout":       0.0,
		"bos_token_id":            c.bosID(),
		"dtype":                   torchDType(c),
		"eos_token_id":            c.eosID(),
		"first_k_dense_replace":   o.FirstKDenseReplace,
		"hidden_act":              "silu",
		"hidden_size":             c.HiddenSize,
		"initializer_range":       0.02,
		"intermediate_size":       c.IntermediateSize,
		"kv_lora_rank":            o.KVLoraRank,
		"max_position_embeddings": 4096,
		"model_type":              b.modelType,
		"moe_intermediate_size":   o.MoEIntermediateSize,
		"moe_layer_freq":          1,
		"n_group":                 1,
		"n_routed_experts":        o.NumRoutedExperts,
		"n_shared_experts":        o.NumSharedExperts,
		"norm_topk_prob":          true,
		"num_attention_heads":     c.NumHeads,
		"num_experts_per_tok":     o.NumExpertsPerTok,
		"num_hidden_layers":       c.NumLayers,
		"num_key_value_heads":     c.NumKVHeads,
		"pad_token_id":            c.bosID(),
		"q_lora_rank":             o.QLoraRank,
		"qk_nope_head_dim":        o.QKNopeHeadDim,
		"qk_rope_head_dim":        o.QKRopeHeadDim,
		"rms_norm_eps":            1e-6,
		"rope_parameters":         map[string]any{"rope_theta": 10000.0, "rope_type": "default"},
		"routed_scaling_factor":   2.5,
		"scoring_func":            "sigmoid",
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"topk_group":              1,
		"topk_method":             "noaux_tc",
		"transformers_version":    transformersVersion,
		"use_cache":               true,
		"v_head_dim":              o.VHeadDim,
		"vocab_size":              c.VocabSize,
	}
	if !o.NoNextN {
		cfg["num_nextn_predict_layers"] = o.NextNLayers
	}
	b.config, b.text = cfg, cfg
	return b, nil
}
