package testmodel

import "fmt"

// Dense defaults: hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV
// heads, vocab 512 (about 300 KB in BF16, five 64 KiB shards).
var denseDefaults = Common{
	VocabSize: 512, HiddenSize: 64, IntermediateSize: 128, NumLayers: 2,
	NumHeads: 4, NumKVHeads: 2, HeadDim: 16,
}

// LlamaOptions configures a LlamaForCausalLM checkpoint (model_type llama).
type LlamaOptions struct {
	Common
}

// Qwen2Options configures a Qwen2ForCausalLM checkpoint: q/k/v projections
// carry biases. head_dim is always hidden/heads (Qwen2 has no head_dim key).
type Qwen2Options struct {
	Common
}

// Qwen3Options configures a Qwen3ForCausalLM checkpoint: per-head q_norm and
// k_norm, an explicit head_dim.
type Qwen3Options struct {
	Common
}

// Qwen3MoEOptions configures a Qwen3MoeForCausalLM checkpoint (model_type
// qwen3_moe): Qwen3 attention (q_norm/k_norm), and in every layer a router
// mlp.gate [experts, H] and per-expert mlp.experts.{e}.{gate,up,down}_proj
// (no shared expert), as transformers 5 saves it. MoE's shared-expert and
// fused fields are not used.
type Qwen3MoEOptions struct {
	Common
	MoE
}

// Write generates the checkpoint into dir.
func (o Qwen3MoEOptions) Write(dir string) (*Model, error) {
	return finish(dir)(buildDense(o.Common, kindQwen3MoE, o.MoE))
}

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen3MoEOptions) Layout() (*Model, error) {
	return finish("")(buildDense(o.Common, kindQwen3MoE, o.MoE))
}

// Qwen3Reference has the dimensions of ../shared/reference/qwen3/base:
// 2 layers, hidden 256, 4 heads of 64, 2 KV heads, intermediate 512, vocab
// 512, tied embeddings, 1 MB shards.
func Qwen3Reference() Qwen3Options {
	return Qwen3Options{Common{
		VocabSize: 512, HiddenSize: 256, IntermediateSize: 512, NumLayers: 2,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 64, TieWordEmbeddings: true, MaxShardSize: 1_000_000,
	}}
}

type denseKind int

const (
	kindLlama denseKind = iota
	kindQwen2
	kindQwen3
	kindQwen3MoE
)

// Write generates the checkpoint into dir.
func (o LlamaOptions) Write(dir string) (*Model, error) {
	return finish(dir)(buildDense(o.Common, kindLlama, MoE{}))
}

// Layout returns the Model Write would produce, writing nothing.
func (o LlamaOptions) Layout() (*Model, error) {
	return finish("")(buildDense(o.Common, kindLlama, MoE{}))
}

// Write generates the checkpoint into dir.
func (o Qwen2Options) Write(dir string) (*Model, error) {
	return finish(dir)(buildDense(o.Common, kindQwen2, MoE{}))
}

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen2Options) Layout() (*Model, error) {
	return finish("")(buildDense(o.Common, kindQwen2, MoE{}))
}

// Write generates the checkpoint into dir.
func (o Qwen3Options) Write(dir string) (*Model, error) {
	return finish(dir)(buildDense(o.Common, kindQwen3, MoE{}))
}

// Layout returns the Model Write would produce, writing nothing.
func (o Qwen3Options) Layout() (*Model, error) {
	return finish("")(buildDense(o.Common, kindQwen3, MoE{}))
}

func buildDense(c Common, kind denseKind, moe MoE) (*builder, error) {
	moe = moe.withDefaults()
	d := denseDefaults
	if kind == kindQwen2 {
		h := c.HiddenSize
		if h == 0 {
			h = d.HiddenSize
		}
		n := c.NumHeads
		if n == 0 {
			n = d.NumHeads
		}
		if c.HeadDim != 0 && c.HeadDim*n != h {
			return nil, fmt.Errorf("testmodel: qwen2 head_dim is hidden/heads = %d, not %d", h/n, c.HeadDim)
		}
		if h%n != 0 {
			return nil, fmt.Errorf("testmodel: qwen2 hidden %d not divisible by %d heads", h, n)
		}
		c.HeadDim = h / n
	}
	c = c.withDefaults(d)
	if err := c.check(); err != nil {
		return nil, err
	}
	b := &builder{c: c, prefix: "model.", numLayers: c.NumLayers}
	H, I, V := int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.VocabSize)
	q, kv := int64(c.NumHeads*c.HeadDim), int64(c.NumKVHeads*c.HeadDim)
	b.add("model.embed_tokens.weight", matInit, V, H)
	for l := 0; l < c.NumLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		for _, pr := range []struct {
			n    string
			rows int64
		}{{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}} {
			b.add(p+"self_attn."+pr.n+".weight", matInit, pr.rows, H)
			if kind == kindQwen2 {
				b.add(p+"self_attn."+pr.n+".bias", matInit, pr.rows)
			}
		}
		b.add(p+"self_attn.o_proj.weight", matInit, H, q)
		if kind == kindQwen3 || kind == kindQwen3MoE {
			b.add(p+"self_attn.q_norm.weight", oneInit, int64(c.HeadDim))
			b.add(p+"self_attn.k_norm.weight", oneInit, int64(c.HeadDim))
		}
		if kind == kindQwen3MoE {
			E, EI := int64(moe.NumExperts), int64(moe.MoEIntermediateSize)
			b.add(p+"mlp.gate.weight", matInit, E, H)
			for e := int64(0); e < E; e++ {
				ep := fmt.Sprintf("%smlp.experts.%d.", p, e)
				b.add(ep+"gate_proj.weight", matInit, EI, H)
				b.add(ep+"up_proj.weight", matInit, EI, H)
				b.add(ep+"down_proj.weight", matInit, H, EI)
			}
		} else {
			b.add(p+"mlp.gate_proj.weight", matInit, I, H)
			b.add(p+"mlp.up_proj.weight", matInit, I, H)
			b.add(p+"mlp.down_proj.weight", matInit, H, I)
		}
		b.add(p+"input_layernorm.weight", oneInit, H)
		b.add(p+"post_attention_layernorm.weight", oneInit, H)
	}
	b.add("model.norm.weight", oneInit, H)
	if !c.TieWordEmbeddings {
		b.add("lm_head.weight", matInit, V, H)
	}

	cfg := map[string]any{
		"attention_dropout":       0.0,
		"bos_token_id":            c.bosID(),
		"dtype":                   torchDType(c),
		"eos_token_id":            c.eosID(),
		"hidden_act":              "silu",
		"hidden_size":             c.HiddenSize,
		"initializer_range":       0.02,
		"intermediate_size":       c.IntermediateSize,
		"max_position_embeddings": 4096,
		"num_attention_heads":     c.NumHeads,
		"num_hidden_layers":       c.NumLayers,
		"num_key_value_heads":     c.NumKVHeads,
		"pad_token_id":            c.bosID(),
		"rms_norm_eps":            1e-6,
		"tie_word_embeddings":     c.TieWordEmbeddings,
		"transformers_version":    transformersVersion,
		"use_cache":               true,
		"vocab_size":              c.VocabSize,
	}
	full := make([]string, c.NumLayers)
	for i := range full {
		full[i] = "full_attention"
	}
	switch kind {
	case kindLlama:
		b.arch, b.modelType = "LlamaForCausalLM", "llama"
		cfg["attention_bias"] = false
		cfg["head_dim"] = c.HeadDim
		cfg["mlp_bias"] = false
		cfg["pretraining_tp"] = 1
		cfg["rms_norm_eps"] = 1e-5
		cfg["rope_parameters"] = map[string]any{"rope_theta": 10000.0, "rope_type": "default"}
	case kindQwen2:
		b.arch, b.modelType = "Qwen2ForCausalLM", "qwen2"
		cfg["layer_types"] = full
		cfg["max_window_layers"] = 28
		cfg["rope_parameters"] = map[string]any{"rope_theta": 1000000.0, "rope_type": "default"}
		cfg["sliding_window"] = nil
		cfg["use_sliding_window"] = false
	case kindQwen3MoE:
		b.arch, b.modelType = "Qwen3MoeForCausalLM", "qwen3_moe"
		cfg["attention_bias"] = false
		cfg["head_dim"] = c.HeadDim
		cfg["decoder_sparse_step"] = 1
		cfg["mlp_only_layers"] = []int{}
		cfg["moe_intermediate_size"] = moe.MoEIntermediateSize
		cfg["norm_topk_prob"] = true
		cfg["num_experts"] = moe.NumExperts
		cfg["num_experts_per_tok"] = moe.NumExpertsPerTok
		cfg["output_router_logits"] = false
		cfg["rope_parameters"] = map[string]any{"rope_theta": 1000000.0, "rope_type": "default"}
		cfg["router_aux_loss_coef"] = 0.001
		cfg["sliding_window"] = nil
		cfg["use_sliding_window"] = false
	case kindQwen3:
		b.arch, b.modelType = "Qwen3ForCausalLM", "qwen3"
		cfg["attention_bias"] = false
		cfg["head_dim"] = c.HeadDim
		cfg["layer_types"] = full
		cfg["max_window_layers"] = 28
		cfg["rope_parameters"] = map[string]any{"rope_theta": 1000000.0, "rope_type": "default"}
		cfg["sliding_window"] = nil
		cfg["use_sliding_window"] = false
	}
	cfg["architectures"] = []string{b.arch}
	cfg["model_type"] = b.modelType
	b.config, b.text = cfg, cfg
	return b, nil
}

// torchDType is the config.json "dtype" value for c.DType.
func torchDType(c Common) string {
	switch c.DType {
	case "F16":
		return "float16"
	case "F32":
		return "float32"
	}
	return "bfloat16"
}
