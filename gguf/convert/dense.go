package convert

import (
	"fmt"
	"path/filepath"
)

// dense holds what the plain decoder families (llama, qwen2, qwen3,
// qwen3moe) share: the name map, the shape checks and the vocabulary.
type dense struct {
	ggufArch string
	names    nameMapper
	pre      string // default tokenizer.ggml.pre
	qNorm    bool   // q_norm/k_norm (qwen3)
	biases   bool   // q/k/v biases (qwen2)

	hidden, inter, nVocab, heads, kvHeads, headDim int64
}

func (d *dense) arch() string { return d.ggufArch }

func (d *dense) readDims(m *model) error {
	var err error
	if d.hidden, err = m.mustInt("hidden_size"); err != nil {
		return err
	}
	if d.nVocab, err = m.mustInt("vocab_size"); err != nil {
		return err
	}
	if d.heads, err = m.mustInt("num_attention_heads"); err != nil {
		return err
	}
	d.kvHeads = d.heads
	if v, ok := m.int("num_key_value_heads"); ok {
		d.kvHeads = v
	}
	if d.heads <= 0 || d.kvHeads <= 0 || d.hidden <= 0 || d.nVocab <= 0 {
		return m.cfgErr("hidden_size, vocab_size and head counts must be positive")
	}
	d.headDim = d.hidden / d.heads
	if v, ok := m.int("head_dim"); ok {
		d.headDim = v
	}
	d.inter, _ = m.int("intermediate_size")
	if fileExists(filepath.Join(m.dir, "modules.json")) {
		return errf(filepath.Join(m.dir, "modules.json"), "", -1, ErrUnsupportedArch, "sentence-transformers pooling models are not supported")
	}
	return nil
}

func (d *dense) finish(*model) error { return nil }

// vocab: sentencepiece (tokenizer.model) is tried first by the reference
// converter; only the gpt2 BPE path is built here.
func (d *dense) vocab(m *model, kv *kvList) error {
	if p := filepath.Join(m.dir, "tokenizer.model"); fileExists(p) {
		return errf(p, "", -1, ErrTokenizer, "sentencepiece tokenizers are not supported (only tokenizer.json BPE)")
	}
	return m.gpt2Vocab(kv, d.pre)
}

// check verifies shapes of the trunk tensors against the config and that
// every required tensor is present.
func (d *dense) check(m *model, out []TensorPlan) error {
	want := map[string][]int64{
		"token_embd.weight":  {d.nVocab, d.hidden},
		"output_norm.weight": {d.hidden},
		"output.weight":      {d.nVocab, d.hidden},
	}
	optional := map[string]bool{"output.weight": true}
	q, kvd := d.heads*d.headDim, d.kvHeads*d.headDim
	for l := int64(0); l < m.numHidden; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		want[p+"attn_norm.weight"] = []int64{d.hidden}
		want[p+"ffn_norm.weight"] = []int64{d.hidden}
		want[p+"attn_q.weight"] = []int64{q, d.hidden}
		want[p+"attn_k.weight"] = []int64{kvd, d.hidden}
		want[p+"attn_v.weight"] = []int64{kvd, d.hidden}
		want[p+"attn_output.weight"] = []int64{d.hidden, q}
		if d.qNorm {
			want[p+"attn_q_norm.weight"] = []int64{d.headDim}
			want[p+"attn_k_norm.weight"] = []int64{d.headDim}
		}
		if d.biases {
			for n, r := range map[string]int64{"attn_q.bias": q, "attn_k.bias": kvd, "attn_v.bias": kvd} {
				want[p+n] = []int64{r}
				optional[p+n] = true
			}
		}
		if d.inter > 0 {
			want[p+"ffn_gate.weight"] = []int64{d.inter, d.hidden}
			want[p+"ffn_up.weight"] = []int64{d.inter, d.hidden}
			want[p+"ffn_down.weight"] = []int64{d.hidden, d.inter}
		}
	}
	return checkShapes(m, out, want, optional)
}

// checkShapes reports the first output whose shape differs from want, then
// the first required output that is missing.
func checkShapes(m *model, out []TensorPlan, want map[string][]int64, optional map[string]bool) error {
	have := map[string]bool{}
	for _, t := range out {
		have[t.Name] = true
		w, ok := want[t.Name]
		if !ok {
			continue
		}
		if fmt.Sprint(w) != fmt.Sprint(t.vt.Shape) {
			s := t.vt.srcs[0]
			return errf(s.Loc.Shard.Path, s.HFName, s.Loc.Shard.DataOffset()+s.Loc.Info.Begin, ErrShape, "%s has shape %v, the config implies %v", t.Name, t.vt.Shape, w)
		}
	}
	var missing []string
	for name := range want {
		if !have[name] && !optional[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sortStrings(missing)
		return errf(m.dir, "", -1, ErrMissingTensor, "%d GGUF tensors would be missing, first %s (%s has %d layers)", len(missing), missing[0], m.hfArch, m.numHidden)
	}
	return nil
}
