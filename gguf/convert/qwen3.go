package convert

import (
	"os"
	"path/filepath"
	"strings"

	desc "github.com/ferry-llm/ferry/internal/family"
)

// qwen3 is Qwen3ForCausalLM (conversion/qwen.py Qwen3Model): Qwen2 plus
// q_norm/k_norm; norms are written as stored (no +1).
type qwen3 struct{ dense }

var _ family = (*qwen3)(nil)

func newQwen3(g *desc.GGUF) family {
	return &qwen3{dense{ggufArch: g.Arch, pre: g.Pre, qNorm: true, names: namesOf(g)}}
}

func (f *qwen3) init(m *model) error {
	if err := rejectReranker(m); err != nil {
		return err
	}
	return f.readDims(m)
}

func (f *qwen3) params(m *model, kv *kvList) error { return m.textParams(kv) }

func (f *qwen3) modify(m *model, v *vtensor, _ int) ([]*vtensor, error) {
	return f.names.mapped(m, v)
}

// rejectReranker refuses Qwen3 reranker checkpoints, which the reference
// converter turns into a classifier head (cls.output) this port lacks.
func rejectReranker(m *model) error {
	readme, _ := os.ReadFile(filepath.Join(m.dir, "README.md"))
	r := strings.ToLower(string(readme))
	hints := []string{strings.ToLower(dirName(m.dir)), strings.ToLower(m.cfg.ModelType), strings.ToLower(m.hfArch)}
	if s, ok := m.cfg.Raw["_name_or_path"].(string); ok {
		hints = append(hints, strings.ToLower(s))
	}
	rerank := strings.Contains(r, "# qwen3-reranker") || strings.Contains(r, "# qwen3-vl-reranker")
	for _, h := range hints {
		if strings.Contains(h, "qwen3-reranker") || strings.Contains(h, "qwen3-vl-reranker") {
			rerank = true
		}
	}
	if rerank {
		return m.cfgErr("Qwen3 reranker checkpoints are not supported")
	}
	return nil
}
