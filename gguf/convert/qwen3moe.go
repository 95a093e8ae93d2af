package convert

import (
	"fmt"

	desc "github.com/ferry-llm/ferry/internal/family"
)

// qwen3moe is Qwen3MoeForCausalLM (conversion/qwen.py Qwen3MoeModel, from
// Qwen2MoeModel): per-expert tensors stacked into ffn_{down,gate,up}_exps,
// the router mlp.gate as ffn_gate_inp (F32).
type qwen3moe struct {
	dense
	experts expertStacker
	nExp    int64
	moeFF   int64
}

var _ family = (*qwen3moe)(nil)

func newQwen3MoE(g *desc.GGUF) family {
	return &qwen3moe{dense: dense{ggufArch: g.Arch, pre: g.Pre, qNorm: true, names: namesOf(g)}}
}

func (f *qwen3moe) init(m *model) error {
	if err := f.readDims(m); err != nil {
		return err
	}
	var ok bool
	if f.nExp, ok = m.findInt("num_local_experts", "num_experts"); !ok || f.nExp <= 0 {
		return m.cfgErr("num_experts is missing")
	}
	f.moeFF, _ = m.int("moe_intermediate_size")
	f.inter = 0 // dense MLP shapes are not checked for MoE layers
	return nil
}

func (f *qwen3moe) params(m *model, kv *kvList) error {
	if err := m.textParams(kv); err != nil {
		return err
	}
	m.moeParams(kv)
	return nil
}

func (f *qwen3moe) modify(m *model, v *vtensor, bid int) ([]*vtensor, error) {
	return f.experts.modify(m, v, bid, func(w *vtensor) ([]*vtensor, error) { return f.names.mapped(m, w) })
}

func (f *qwen3moe) finish(m *model) error { return f.experts.finish(m) }

func (f *qwen3moe) check(m *model, out []TensorPlan) error {
	if err := f.dense.check(m, out); err != nil {
		return err
	}
	want := map[string][]int64{}
	for l := int64(0); l < m.numHidden; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		want[p+"ffn_gate_inp.weight"] = []int64{f.nExp, f.hidden}
		if f.moeFF > 0 {
			want[p+"ffn_gate_exps.weight"] = []int64{f.nExp, f.moeFF, f.hidden}
			want[p+"ffn_up_exps.weight"] = []int64{f.nExp, f.moeFF, f.hidden}
			want[p+"ffn_down_exps.weight"] = []int64{f.nExp, f.hidden, f.moeFF}
		}
	}
	return checkShapes(m, out, want, nil)
}
