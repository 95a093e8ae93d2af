package convert

import desc "github.com/ferry-llm/ferry/internal/family"

// qwen2 is Qwen2ForCausalLM (conversion/qwen.py Qwen2Model): q/k/v biases,
// no Q/K permutation.
type qwen2 struct{ dense }

var _ family = (*qwen2)(nil)

func newQwen2(g *desc.GGUF) family {
	return &qwen2{dense{ggufArch: g.Arch, pre: g.Pre, biases: true, names: namesOf(g)}}
}

func (f *qwen2) init(m *model) error                                    { return f.readDims(m) }
func (f *qwen2) params(m *model, kv *kvList) error                      { return m.textParams(kv) }
func (f *qwen2) modify(m *model, v *vtensor, _ int) ([]*vtensor, error) { return f.names.mapped(m, v) }
