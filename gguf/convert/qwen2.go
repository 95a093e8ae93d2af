package convert

// qwen2 is Qwen2ForCausalLM (conversion/qwen.py Qwen2Model): q/k/v biases,
// no Q/K permutation.
type qwen2 struct{ dense }

var _ family = (*qwen2)(nil)

func newQwen2() family {
	return &qwen2{dense{ggufArch: "qwen2", pre: "qwen2", biases: true,
		names: newNameMapper("ffn_norm", "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}}
}

func (f *qwen2) init(m *model) error                                    { return f.readDims(m) }
func (f *qwen2) params(m *model, kv *kvList) error                      { return m.textParams(kv) }
func (f *qwen2) modify(m *model, v *vtensor, _ int) ([]*vtensor, error) { return f.names.mapped(m, v) }
