package convert

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
)

// textParams is TextModel.set_gguf_parameters: the {arch}.* keys every
// text model writes, ending with general.file_type.
func (m *model) textParams(kv *kvList) error {
	a := m.fam.arch()
	kv.add(gguf.U32(a+".block_count", uint32(m.blockCount)))
	if v, ok := m.findInt("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length"); ok {
		kv.add(gguf.U32(a+".context_length", uint32(v)))
	}
	if v, ok := m.findInt("hidden_size", "n_embd", "dim"); ok {
		kv.add(gguf.U32(a+".embedding_length", uint32(v)))
	}
	if v, ok := m.findInt("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner", "hidden_dim"); ok {
		kv.add(gguf.U32(a+".feed_forward_length", uint32(v)))
	}
	if v, ok := m.findInt("num_attention_heads", "n_head", "n_heads"); ok {
		kv.add(gguf.U32(a+".attention.head_count", uint32(v)))
	}
	if v, ok := m.findInt("num_key_value_heads", "n_kv_heads"); ok {
		kv.add(gguf.U32(a+".attention.head_count_kv", uint32(v)))
	}
	if b, ok := m.cfg.Bool("is_causal"); ok && !b {
		kv.add(gguf.Bool(a+".attention.causal", false))
	}
	rope := m.ropeParams
	if fa, ok := m.ropeParams["full_attention"].(map[string]any); ok {
		rope = fa
	}
	if rt, ok := rope["rope_type"].(string); ok {
		factor, hasFactor := jsonFloat(rope["factor"])
		switch {
		case rt == "linear" && hasFactor:
			kv.add(gguf.Str(a+".rope.scaling.type", "linear"))
			kv.add(gguf.F32(a+".rope.scaling.factor", float32(factor)))
		case rt == "yarn" && hasFactor:
			kv.add(gguf.Str(a+".rope.scaling.type", "yarn"))
			kv.add(gguf.F32(a+".rope.scaling.factor", float32(factor)))
			orig, ok := jsonInt(rope["original_max_position_embeddings"])
			if !ok {
				return m.cfgErr("yarn rope scaling without original_max_position_embeddings")
			}
			kv.add(gguf.U32(a+".rope.scaling.original_context_length", uint32(orig)))
			for _, f := range []struct{ src, key string }{{"extrapolation_factor", "yarn_ext_factor"}, {"attention_factor", "yarn_attn_factor"}, {"beta_fast", "yarn_beta_fast"}, {"beta_slow", "yarn_beta_slow"}} {
				v, ok := jsonFloat(rope[f.src])
				if !ok && f.src == "attention_factor" {
					v, ok = jsonFloat(rope["attn_factor"])
				}
				if ok {
					kv.add(gguf.F32(a+".rope.scaling."+f.key, float32(v)))
				}
			}
		case rt == "su" || rt == "longrope":
			return m.cfgErr("rope_type %q (longrope factors) is not supported", rt)
		case strings.ToLower(rt) == "llama3":
			return m.cfgErr("rope_type llama3 (rope_freqs tensor) is not supported")
		}
	}
	if ms, ok := m.ropeParams["mrope_section"].([]any); ok {
		sec := make([]int32, 0, 4)
		for _, x := range ms {
			v, ok := jsonInt(x)
			if !ok {
				return m.cfgErr("mrope_section %v", ms)
			}
			sec = append(sec, int32(v))
		}
		for len(sec) < 4 {
			sec = append(sec, 0)
		}
		kv.add(gguf.I32s(a+".rope.dimension_sections", sec[:4]))
	}
	if v, ok := jsonFloat(rope["rope_theta"]); ok {
		kv.add(gguf.F32(a+".rope.freq_base", float32(v)))
	}
	if sw, ok := m.ropeParams["sliding_attention"].(map[string]any); ok {
		if v, ok := jsonFloat(sw["rope_theta"]); ok {
			kv.add(gguf.F32(a+".rope.freq_base_swa", float32(v)))
		}
	}
	if v, ok := m.findFloat("rms_norm_eps", "norm_eps"); ok {
		kv.add(gguf.F32(a+".attention.layer_norm_rms_epsilon", float32(v)))
	}
	if v, ok := m.findFloat("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"); ok {
		kv.add(gguf.F32(a+".attention.layer_norm_epsilon", float32(v)))
	}
	if v, ok := m.findInt("num_local_experts", "num_experts", "n_routed_experts"); ok {
		kv.add(gguf.U32(a+".expert_count", uint32(v)))
	}
	if v, ok := m.findInt("num_experts_per_tok", "num_experts_per_token", "top_k_experts"); ok {
		kv.add(gguf.U32(a+".expert_used_count", uint32(v)))
	}
	if v, ok := m.int("n_group"); ok {
		kv.add(gguf.U32(a+".expert_group_count", uint32(v)))
	}
	if v, ok := m.int("topk_group"); ok {
		kv.add(gguf.U32(a+".expert_group_used_count", uint32(v)))
	}
	for _, k := range []string{"score_function", "scoring_func", "score_func", "moe_router_activation", "moe_router_activation_func", "expert_selection_fn"} {
		v, ok := m.cfg.Get(k)
		if !ok {
			continue
		}
		if v == nil {
			break
		}
		codes := map[string]uint32{"softmax": 1, "sigmoid": 2, "sqrtsoftplus": 4} // ExpertGatingFuncType
		s, _ := v.(string)
		code, ok := codes[s]
		if !ok {
			return m.cfgErr("unsupported expert score gating function %v", v)
		}
		kv.add(gguf.U32(a+".expert_gating_func", code))
		break
	}
	if v, ok := m.int("head_dim"); ok {
		kv.add(gguf.U32(a+".attention.key_length", uint32(v)))
		kv.add(gguf.U32(a+".attention.value_length", uint32(v)))
	}
	kv.add(gguf.U32("general.file_type", uint32(m.outType.fileType())))
	return nil
}

// moeParams is Qwen2MoeModel.set_gguf_parameters' addition.
func (m *model) moeParams(kv *kvList) {
	a := m.fam.arch()
	if v, ok := m.int("moe_intermediate_size"); ok {
		kv.add(gguf.U32(a+".expert_feed_forward_length", uint32(v)))
	}
	if v, ok := m.int("shared_expert_intermediate_size"); ok {
		kv.add(gguf.U32(a+".expert_shared_feed_forward_length", uint32(v)))
	}
}

// Tensor name mapping (gguf-py tensor_mapping.py, for the names these
// families use). Keys are relative to model.layers.{bid}.
var (
	globalNames = map[string]string{
		"model.embed_tokens": "token_embd",
		"model.norm":         "output_norm",
		"lm_head":            "output",
	}
	layerNames = map[string]string{
		"input_layernorm":             "attn_norm",
		"self_attn.q_proj":            "attn_q",
		"self_attn.k_proj":            "attn_k",
		"self_attn.v_proj":            "attn_v",
		"self_attn.o_proj":            "attn_output",
		"self_attn.q_norm":            "attn_q_norm",
		"self_attn.k_norm":            "attn_k_norm",
		"mlp.gate_proj":               "ffn_gate",
		"mlp.up_proj":                 "ffn_up",
		"mlp.down_proj":               "ffn_down",
		"mlp.gate":                    "ffn_gate_inp",
		"mlp.experts.gate_proj":       "ffn_gate_exps",
		"mlp.experts.up_proj":         "ffn_up_exps",
		"mlp.experts.down_proj":       "ffn_down_exps",
		"mlp.shared_expert.gate_proj": "ffn_gate_shexp",
		"mlp.shared_expert.up_proj":   "ffn_up_shexp",
		"mlp.shared_expert.down_proj": "ffn_down_shexp",
		"mlp.shared_expert_gate":      "ffn_gate_inp_shexp",
		"linear_attn.in_proj_qkv":     "attn_qkv",
		"linear_attn.in_proj_z":       "attn_gate",
		"linear_attn.in_proj_b":       "ssm_beta",
		"linear_attn.in_proj_a":       "ssm_alpha",
		"linear_attn.in_proj_ba":      "ssm_ba",
		"linear_attn.conv1d":          "ssm_conv1d",
		"linear_attn.dt_proj":         "ssm_dt",
		"linear_attn.A_log":           "ssm_a",
		"linear_attn.norm":            "ssm_norm",
		"linear_attn.out_proj":        "ssm_out",
		"eh_proj":                     "nextn.eh_proj",
		"enorm":                       "nextn.enorm",
		"hnorm":                       "nextn.hnorm",
		"shared_head.norm":            "nextn.shared_head_norm",
		"post_attention_layernorm":    "", // family-specific
	}
)

// nameMapper maps HF names to GGUF names for one architecture: stems lists
// the GGUF tensors the architecture has (MODEL_TENSORS), postAttn is what
// post_attention_layernorm becomes.
type nameMapper struct {
	stems    map[string]bool
	postAttn string
}

func newNameMapper(postAttn string, stems ...string) nameMapper {
	nm := nameMapper{stems: map[string]bool{"token_embd": true, "output_norm": true, "output": true, postAttn: true}, postAttn: postAttn}
	for _, s := range stems {
		nm.stems[s] = true
	}
	return nm
}

// mapName is TensorNameMap.get_name with try_suffixes (.weight, .bias).
func (nm nameMapper) mapName(m *model, name string) (string, error) {
	if out, ok := nm.lookup(m, name); ok {
		return out, nil
	}
	for _, suf := range []string{".weight", ".bias"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if out, ok := nm.lookup(m, base); ok {
				return out + suf, nil
			}
		}
	}
	return "", fmt.Errorf("%w %q for %s (%s)", ErrUnknownTensor, name, m.fam.arch(), m.hfArch)
}

func (nm nameMapper) lookup(m *model, base string) (string, bool) {
	if g, ok := globalNames[base]; ok {
		return g, nm.stems[g]
	}
	rest, ok := strings.CutPrefix(base, "model.layers.")
	if !ok {
		return "", false
	}
	num, key, ok := strings.Cut(rest, ".")
	if !ok || !isDecimal(num) {
		return "", false
	}
	bid, err := strconv.Atoi(num)
	if err != nil || int64(bid) >= m.blockCount {
		return "", false
	}
	stem, ok := layerNames[key]
	if !ok {
		return "", false
	}
	if key == "post_attention_layernorm" {
		stem = nm.postAttn
	}
	if !nm.stems[stem] {
		return "", false
	}
	return fmt.Sprintf("blk.%d.%s", bid, stem), true
}

// mapped renames v through the mapper (ModelBase.modify_tensors).
func (nm nameMapper) mapped(m *model, v *vtensor) ([]*vtensor, error) {
	name, err := nm.mapName(m, v.Name)
	if err != nil {
		return nil, err
	}
	return []*vtensor{v.renamed(name)}, nil
}

// expertStacker is Qwen2MoeModel.modify_tensors: per-expert tensors are
// held until a layer's E×3 have arrived, then stacked and emitted in the
// order down, gate, up; fused gate_up_proj [E, 2·I, H] is split into gate
// and up; fused down_proj passes through.
type expertStacker struct {
	pending map[int]map[string]*vtensor
}

func (s *expertStacker) modify(m *model, v *vtensor, bid int, next func(*vtensor) ([]*vtensor, error)) ([]*vtensor, error) {
	name := v.Name
	if strings.HasSuffix(name, "mlp.experts.down_proj") || strings.HasSuffix(name, "mlp.experts.down_proj.weight") {
		if !strings.HasSuffix(name, ".weight") {
			name += ".weight"
		}
		return next(v.renamed(name))
	}
	if strings.HasSuffix(name, "mlp.experts.gate_up_proj") || strings.HasSuffix(name, "mlp.experts.gate_up_proj.weight") {
		if len(v.Shape) < 3 || v.Shape[len(v.Shape)-2]%2 != 0 {
			return nil, fmt.Errorf("%w: gate_up_proj shape %v", ErrShape, v.Shape)
		}
		nff := v.Shape[len(v.Shape)-2] / 2
		shape := append(append([]int64(nil), v.Shape[:len(v.Shape)-2]...), nff, v.Shape[len(v.Shape)-1])
		base := strings.TrimSuffix(strings.TrimSuffix(name, ".weight"), ".gate_up_proj")
		gate := v.gatherRowsShape(shape, func(i int64) int64 { return i/nff*2*nff + i%nff }, "gate half").renamed(base + ".gate_proj.weight")
		up := v.gatherRowsShape(shape, func(i int64) int64 { return i/nff*2*nff + nff + i%nff }, "up half").renamed(base + ".up_proj.weight")
		g, err := next(gate)
		if err != nil {
			return nil, err
		}
		u, err := next(up)
		if err != nil {
			return nil, err
		}
		return append(g, u...), nil
	}
	if !strings.Contains(name, "experts") {
		return next(v)
	}
	n, ok := m.findInt("num_local_experts", "num_experts")
	if !ok || n <= 0 {
		return nil, m.cfgErr("expert tensors but no num_experts")
	}
	if bid < 0 {
		return nil, fmt.Errorf("%w: expert tensor outside a layer", ErrUnknownTensor)
	}
	if s.pending == nil {
		s.pending = map[int]map[string]*vtensor{}
	}
	if s.pending[bid] == nil {
		s.pending[bid] = map[string]*vtensor{}
	}
	s.pending[bid][name] = v
	if int64(len(s.pending[bid])) < 3*n {
		return nil, nil
	}
	var out []*vtensor
	for _, w := range []string{"down_proj", "gate_proj", "up_proj"} {
		parts := make([]*vtensor, n)
		for x := int64(0); x < n; x++ {
			en := fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", bid, x, w)
			p, ok := s.pending[bid][en]
			if !ok {
				return nil, fmt.Errorf("%w: %s (layer %d has %d expert tensors but not this one)", ErrMissingTensor, en, bid, len(s.pending[bid]))
			}
			parts[x] = p
			delete(s.pending[bid], en)
		}
		st, err := stack(fmt.Sprintf("model.layers.%d.mlp.experts.%s.weight", bid, w), parts)
		if err != nil {
			return nil, err
		}
		o, err := next(st)
		if err != nil {
			return nil, err
		}
		out = append(out, o...)
	}
	return out, nil
}

func (s *expertStacker) finish(m *model) error {
	for bid, p := range s.pending {
		for name := range p {
			return errf(m.dir, name, -1, ErrMissingTensor, "layer %d: unprocessed expert tensors (%d held; want %s×3 per layer)", bid, len(p), "num_experts")
		}
	}
	return nil
}
