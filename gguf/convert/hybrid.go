package convert

import (
	"fmt"
	"sort"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/tensor"
)

// hybrid holds what the Gated-DeltaNet hybrid families share
// (conversion/qwen.py: _QwenMtpMixin, Qwen3NextModel,
// _LinearAttentionVReorderBase, _Qwen35MRopeMixin): the MTP block, the
// ssm.* keys, the linear-attention transforms and the shape checks.
type hybrid struct {
	ggufArch string
	names    nameMapper
	pre      string
	moe      bool
	reorder  bool // V-head grouped → tiled reorder (Qwen3.5), not Qwen3-Next
	mrope    bool // always write rope.dimension_sections (Qwen3.5)
	experts  expertStacker

	hidden, inter, nVocab, heads, kvHeads, headDim int64
	nk, nv, hk, hv, convK                          int64
	nExp, moeFF, shFF                              int64
	mtpFromTensors                                 int64
}

func (h *hybrid) arch() string { return h.ggufArch }

// filter is _QwenMtpMixin.filter_tensors: mtp.* becomes block
// num_hidden_layers (+i), or is dropped with --no-mtp; --mtp-only keeps
// the MTP block and the embedding, final norm and output head.
func (h *hybrid) filter(m *model, name string) (string, bool) {
	if strings.HasPrefix(name, "model.mtp.") {
		name = strings.Replace(name, "model.", "", 1)
	}
	if strings.HasPrefix(name, "mtp.") {
		if m.opts.NoMTP {
			return "", false
		}
		remap := map[string]string{"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head.norm"}
		parts := strings.SplitN(name, ".", 4)
		if len(parts) == 4 && parts[1] == "layers" && isDecimal(parts[2]) {
			var idx int64
			fmt.Sscan(parts[2], &idx)
			name = fmt.Sprintf("model.layers.%d.%s", m.numHidden+idx, parts[3])
			h.mtpFromTensors = max(h.mtpFromTensors, idx+1)
		} else if len(parts) == 3 {
			if r, ok := remap[parts[1]]; ok {
				name = fmt.Sprintf("model.layers.%d.%s.%s", m.numHidden, r, parts[2])
			}
		}
		return name, true
	}
	if m.opts.MTPOnly {
		switch name {
		case "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "embed_tokens.weight", "norm.weight":
			return name, true
		}
		return "", false
	}
	return name, true
}

func (h *hybrid) init(m *model) error {
	var err error
	for _, f := range []struct {
		key string
		dst *int64
	}{
		{"hidden_size", &h.hidden}, {"vocab_size", &h.nVocab}, {"num_attention_heads", &h.heads},
		{"num_key_value_heads", &h.kvHeads}, {"linear_num_key_heads", &h.nk}, {"linear_num_value_heads", &h.nv},
		{"linear_key_head_dim", &h.hk}, {"linear_value_head_dim", &h.hv}, {"linear_conv_kernel_dim", &h.convK},
	} {
		if *f.dst, err = m.mustInt(f.key); err != nil {
			return err
		}
		if *f.dst <= 0 {
			return m.cfgErr("%s must be positive", f.key)
		}
	}
	h.headDim = h.hidden / h.heads
	if v, ok := m.int("head_dim"); ok {
		h.headDim = v
	}
	if h.nv%h.nk != 0 {
		return m.cfgErr("linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", h.nv, h.nk)
	}
	h.inter, _ = m.int("intermediate_size")
	if h.moe {
		if h.nExp, _ = m.findInt("num_local_experts", "num_experts"); h.nExp <= 0 {
			return m.cfgErr("num_experts is missing")
		}
		h.moeFF, _ = m.int("moe_intermediate_size")
		h.shFF, _ = m.int("shared_expert_intermediate_size")
	}

	// _QwenMtpMixin.__init__: block_count = num_hidden_layers + n_mtp.
	cfgMTP, _ := m.int("mtp_num_hidden_layers")
	if m.opts.NoMTP {
		if m.opts.MTPOnly {
			return errf(m.dir, "", -1, ErrOptions, "--no-mtp with --mtp-only")
		}
		return nil
	}
	if m.mtpTensors == 0 {
		if cfgMTP > 0 {
			return errf(m.dir, "", -1, ErrMTPMissing,
				"config.json has mtp_num_hidden_layers = %d but no shard holds an mtp.* tensor (a PEFT merge_and_unload drops them: carry them over from the base checkpoint, or convert with --no-mtp to write a file without the MTP head)", cfgMTP)
		}
		return errf(m.dir, "", -1, ErrMTPMissing, "no mtp_num_hidden_layers in config.json and no mtp.* tensors; convert with --no-mtp")
	}
	n := cfgMTP
	if n == 0 {
		n = h.mtpFromTensors
	}
	if h.mtpFromTensors > n {
		return errf(m.dir, "", -1, ErrConfig, "mtp.layers.%d exists but config.json says mtp_num_hidden_layers = %d", h.mtpFromTensors-1, n)
	}
	m.nMTP = n
	m.blockCount = m.numHidden + n
	return nil
}

func (h *hybrid) params(m *model, kv *kvList) error {
	a := h.ggufArch
	if err := m.textParams(kv); err != nil {
		return err
	}
	if h.moe {
		m.moeParams(kv)
	}
	if !m.opts.NoMTP && m.blockCount > m.numHidden {
		kv.add(gguf.U32(a+".nextn_predict_layers", uint32(m.blockCount-m.numHidden)))
	}
	kv.add(gguf.U32(a+".ssm.conv_kernel", uint32(h.convK)))
	kv.add(gguf.U32(a+".ssm.state_size", uint32(h.hk)))
	kv.add(gguf.U32(a+".ssm.group_count", uint32(h.nk)))
	kv.add(gguf.U32(a+".ssm.time_step_rank", uint32(h.nv)))
	kv.add(gguf.U32(a+".ssm.inner_size", uint32(h.hv*h.nv)))
	fai := int64(4)
	if v, ok := m.int("full_attention_interval"); ok {
		fai = v
	}
	kv.add(gguf.U32(a+".full_attention_interval", uint32(fai)))
	prf := 0.25
	if v, ok := m.ropeFloat("partial_rotary_factor"); ok {
		prf = v
	}
	kv.add(gguf.U32(a+".rope.dimension_count", uint32(int64(float64(h.headDim)*prf))))
	if h.mrope {
		if _, ok := m.ropeParams["mrope_section"]; !ok {
			kv.add(gguf.I32s(a+".rope.dimension_sections", []int32{11, 11, 10, 0}))
		}
	}
	return nil
}

func (h *hybrid) vocab(m *model, kv *kvList) error { return m.gpt2Vocab(kv, h.pre) }

func (h *hybrid) finish(m *model) error { return h.experts.finish(m) }

// modify runs the class chain: V-head reorder (Qwen3.5), the Qwen3-Next
// transforms, expert stacking, name mapping.
func (h *hybrid) modify(m *model, v *vtensor, bid int) ([]*vtensor, error) {
	if h.reorder && h.nk != h.nv && strings.Contains(v.Name, "linear_attn.") {
		var err error
		if v, err = h.reorderV(v); err != nil {
			return nil, err
		}
	}
	name := v.Name
	switch {
	case strings.HasSuffix(name, ".A_log"):
		// prepare_tensors keeps F16 as F16 and widens every other dtype
		// to F32 before modify_tensors, so torch's exp runs in that dtype.
		op := opNegExp
		if len(v.srcs) == 1 && v.srcs[0].DType == tensor.F16 {
			op = opNegExpF16
		}
		v = v.withOp(op)
	case strings.HasSuffix(name, ".dt_bias"):
		v = v.renamed(strings.TrimSuffix(name, ".dt_bias") + ".dt_proj.bias")
	case strings.Contains(name, "conv1d"):
		var err error
		if v, err = squeeze(v); err != nil {
			return nil, err
		}
	case strings.HasSuffix(name, "norm.weight") && !strings.HasSuffix(name, "linear_attn.norm.weight"):
		// As for A_log: an F16 weight gets its +1 in float16.
		op := opAddOne
		if len(v.srcs) == 1 && v.srcs[0].DType == tensor.F16 {
			op = opAddOneF16
		}
		v = v.withOp(op)
	}
	if strings.Contains(v.Name, "in_proj_qkvz.weight") {
		return h.splitQKVZ(v, bid)
	}
	return h.experts.modify(m, v, bid, func(w *vtensor) ([]*vtensor, error) { return h.names.mapped(m, w) })
}

// squeeze drops size-1 dimensions (torch squeeze()).
func squeeze(v *vtensor) (*vtensor, error) {
	var shape []int64
	for _, d := range v.Shape {
		if d != 1 {
			shape = append(shape, d)
		}
	}
	if len(shape) == len(v.Shape) {
		return v, nil
	}
	w, err := v.reshapeKeepCols(shape, "squeeze")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrShape, err)
	}
	return w, nil
}

// reorderV is _LinearAttentionVReorderBase.modify_tensors.
func (h *hybrid) reorderV(v *vtensor) (*vtensor, error) {
	r := h.nv / h.nk
	name := v.Name
	qk := h.hk * h.nk * 2
	switch {
	case strings.Contains(name, ".in_proj_qkv."):
		p := vHeadReorder(h.nk, r, h.hv)
		return v.gatherRows(func(i int64) int64 {
			if i < qk {
				return i
			}
			return qk + p(i-qk)
		}, "V-head reorder (V rows)"), nil
	case strings.Contains(name, ".in_proj_z."):
		return v.gatherRows(vHeadReorder(h.nk, r, h.hv), "V-head reorder (rows)"), nil
	case strings.Contains(name, ".in_proj_b.") || strings.Contains(name, ".in_proj_a."):
		return v.gatherRows(vHeadReorder(h.nk, r, 1), "V-head reorder (rows)"), nil
	case strings.Contains(name, ".A_log") || strings.Contains(name, ".dt_bias") || strings.Contains(name, ".dt_proj"):
		return v.permuteCols(vHeadReorder(h.nk, r, 1), "V-head reorder"), nil
	case strings.Contains(name, ".conv1d"):
		w, err := squeeze(v)
		if err != nil {
			return nil, err
		}
		if len(w.Shape) != 2 {
			return nil, fmt.Errorf("%w: conv1d %v", ErrShape, v.Shape)
		}
		p := vHeadReorder(h.nk, r, h.hv)
		return w.gatherRows(func(i int64) int64 {
			if i < qk {
				return i
			}
			return qk + p(i-qk)
		}, "V-head reorder (V channels)"), nil
	case strings.Contains(name, ".out_proj."):
		return v.permuteCols(vHeadReorder(h.nk, r, h.hv), "V-head reorder (columns)"), nil
	}
	return v, nil
}

// splitQKVZ is Qwen3NextModel's in_proj_qkvz split: per K head the rows are
// [q hk, k hk, v r·hv, z r·hv]; attn_qkv gathers all q, then k, then v rows,
// attn_gate all z rows.
func (h *hybrid) splitQKVZ(v *vtensor, bid int) ([]*vtensor, error) {
	r := h.nv / h.nk
	per := 2*h.hk + 2*r*h.hv
	if len(v.Shape) != 2 || v.Shape[0] != h.nk*per {
		return nil, fmt.Errorf("%w: in_proj_qkvz %v, want [%d, hidden]", ErrShape, v.Shape, h.nk*per)
	}
	H := v.Shape[1]
	nq := h.nk * h.hk
	nv := h.nk * r * h.hv
	qkv := v.gatherRowsShape([]int64{2*nq + nv, H}, func(i int64) int64 {
		switch {
		case i < nq:
			return i/h.hk*per + i%h.hk
		case i < 2*nq:
			j := i - nq
			return j/h.hk*per + h.hk + j%h.hk
		default:
			j := i - 2*nq
			return j/(r*h.hv)*per + 2*h.hk + j%(r*h.hv)
		}
	}, "qkvz split (q, k, v)").renamed(fmt.Sprintf("blk.%d.attn_qkv.weight", bid))
	z := v.gatherRowsShape([]int64{nv, H}, func(j int64) int64 {
		return j/(r*h.hv)*per + 2*h.hk + r*h.hv + j%(r*h.hv)
	}, "qkvz split (z)").renamed(fmt.Sprintf("blk.%d.attn_gate.weight", bid))
	return []*vtensor{qkv, z}, nil
}

// check verifies the trunk's and the MTP block's shapes against the config.
func (h *hybrid) check(m *model, out []TensorPlan) error {
	H := h.hidden
	want := map[string][]int64{
		"token_embd.weight": {h.nVocab, H}, "output_norm.weight": {H}, "output.weight": {h.nVocab, H},
	}
	optional := map[string]bool{"output.weight": true}
	types := layerTypes(m, h)
	keyDim, valDim := h.nk*h.hk, h.nv*h.hv
	conv := 2*keyDim + valDim
	q, kvd := h.heads*h.headDim, h.kvHeads*h.headDim
	attn := func(p string) {
		want[p+"attn_q.weight"] = []int64{2 * q, H}
		want[p+"attn_k.weight"] = []int64{kvd, H}
		want[p+"attn_v.weight"] = []int64{kvd, H}
		want[p+"attn_output.weight"] = []int64{H, q}
		want[p+"attn_q_norm.weight"] = []int64{h.headDim}
		want[p+"attn_k_norm.weight"] = []int64{h.headDim}
	}
	mlp := func(p string) {
		if !h.moe {
			if h.inter > 0 {
				want[p+"ffn_gate.weight"] = []int64{h.inter, H}
				want[p+"ffn_up.weight"] = []int64{h.inter, H}
				want[p+"ffn_down.weight"] = []int64{H, h.inter}
			}
			return
		}
		want[p+"ffn_gate_inp.weight"] = []int64{h.nExp, H}
		if h.moeFF > 0 {
			want[p+"ffn_gate_exps.weight"] = []int64{h.nExp, h.moeFF, H}
			want[p+"ffn_up_exps.weight"] = []int64{h.nExp, h.moeFF, H}
			want[p+"ffn_down_exps.weight"] = []int64{h.nExp, H, h.moeFF}
		}
		if h.shFF > 0 {
			want[p+"ffn_gate_shexp.weight"] = []int64{h.shFF, H}
			want[p+"ffn_up_shexp.weight"] = []int64{h.shFF, H}
			want[p+"ffn_down_shexp.weight"] = []int64{H, h.shFF}
			want[p+"ffn_gate_inp_shexp.weight"] = []int64{1, H}
		}
	}
	first := int64(0)
	if m.opts.MTPOnly {
		first = m.numHidden
		delete(want, "token_embd.weight")
		delete(want, "output_norm.weight")
	}
	for l := first; l < m.blockCount; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		want[p+"attn_norm.weight"] = []int64{H}
		want[p+"post_attention_norm.weight"] = []int64{H}
		mlp(p)
		if l >= m.numHidden { // MTP block: full attention + nextn
			attn(p)
			if l == m.numHidden {
				want[p+"nextn.eh_proj.weight"] = []int64{H, 2 * H}
				want[p+"nextn.enorm.weight"] = []int64{H}
				want[p+"nextn.hnorm.weight"] = []int64{H}
				want[p+"nextn.shared_head_norm.weight"] = []int64{H}
			}
			continue
		}
		if types[l] == "full_attention" {
			attn(p)
			continue
		}
		if h.reorder {
			want[p+"attn_qkv.weight"] = []int64{conv, H}
			want[p+"attn_gate.weight"] = []int64{valDim, H}
			want[p+"ssm_beta.weight"] = []int64{h.nv, H}
			want[p+"ssm_alpha.weight"] = []int64{h.nv, H}
		} else {
			want[p+"attn_qkv.weight"] = []int64{conv, H}
			want[p+"attn_gate.weight"] = []int64{valDim, H}
			want[p+"ssm_ba.weight"] = []int64{2 * h.nv, H}
		}
		want[p+"ssm_conv1d.weight"] = []int64{conv, h.convK}
		want[p+"ssm_dt.bias"] = []int64{h.nv}
		want[p+"ssm_a"] = []int64{h.nv}
		want[p+"ssm_norm.weight"] = []int64{h.hv}
		want[p+"ssm_out.weight"] = []int64{H, valDim}
	}
	return checkShapes(m, out, want, optional)
}

// layerTypes is config layer_types, or the full_attention_interval
// pattern llama.cpp assumes without it.
func layerTypes(m *model, h *hybrid) []string {
	out := make([]string, m.numHidden)
	if lt, ok := m.cfg.Get("layer_types"); ok {
		if list, ok := lt.([]any); ok && int64(len(list)) == m.numHidden {
			for i, x := range list {
				out[i], _ = x.(string)
			}
			return out
		}
	}
	fai := int64(4)
	if v, ok := m.int("full_attention_interval"); ok && v > 0 {
		fai = v
	}
	for i := range out {
		out[i] = "linear_attention"
		if (int64(i)+1)%fai == 0 {
			out[i] = "full_attention"
		}
	}
	return out
}

func sortStrings(s []string) { sort.Strings(s) }
