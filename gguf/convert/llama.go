package convert

import (
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	desc "github.com/ferry-llm/ferry/internal/family"
)

// llama is LlamaForCausalLM (conversion/llama.py LlamaModel): Q and K rows
// are permuted back from the HF rotary layout, and llama.vocab_size and
// llama.rope.dimension_count are written.
type llama struct{ dense }

var _ family = (*llama)(nil)

func newLlama(g *desc.GGUF) family {
	return &llama{dense{ggufArch: g.Arch, pre: g.Pre, names: namesOf(g)}}
}

func (f *llama) init(m *model) error {
	if _, ok := m.cfg.Get("draft_vocab_size"); ok {
		return m.cfgErr("EAGLE-3 draft checkpoints are not supported")
	}
	return f.readDims(m)
}

func (f *llama) params(m *model, kv *kvList) error {
	if err := m.textParams(kv); err != nil {
		return err
	}
	kv.add(gguf.U32("llama.vocab_size", uint32(f.nVocab)))
	kv.add(gguf.U32("llama.rope.dimension_count", uint32(f.headDim)))
	return nil
}

func (f *llama) modify(m *model, v *vtensor, bid int) ([]*vtensor, error) {
	if strings.Contains(v.Name, "block_sparse_moe.experts") {
		return nil, errf(m.dir, v.Name, -1, ErrUnsupportedArch, "Mixtral-style llama experts are not supported")
	}
	rows := int64(1)
	if len(v.Shape) > 0 {
		rows = v.Shape[0]
	}
	if strings.HasSuffix(v.Name, "q_proj.weight") || strings.HasSuffix(v.Name, "q_proj.bias") {
		v = permuteRows(v, f.heads, rows)
	}
	if strings.HasSuffix(v.Name, "k_proj.weight") || strings.HasSuffix(v.Name, "k_proj.bias") {
		v = permuteRows(v, f.kvHeads, rows)
	}
	return f.names.mapped(m, v)
}

// permuteRows applies LlamaModel.permute along the first dimension; a 1-D
// bias is viewed as rows of one element.
func permuteRows(v *vtensor, nHead, rows int64) *vtensor {
	p := llamaPermute(nHead, rows)
	if len(v.Shape) == 1 {
		return v.permuteCols(p, "llama q/k permute")
	}
	return v.gatherRows(p, "llama q/k permute")
}

// vocab writes tokenizer.ggml.add_space_prefix from tokenizer_config.json
// first, as LlamaModel.set_vocab does, then the BPE vocabulary. The
// Llama-2 style (byte-fallback BPE, "llama_hf") vocabulary is refused.
func (f *llama) vocab(m *model, kv *kvList) error {
	if p := filepath.Join(m.dir, "tokenizer.model"); fileExists(p) {
		return errf(p, "", -1, ErrTokenizer, "sentencepiece tokenizers are not supported (only tokenizer.json byte-level BPE)")
	}
	var tc map[string]any
	if p := filepath.Join(m.dir, "tokenizer_config.json"); fileExists(p) {
		if err := readJSONFile(p, &tc); err != nil {
			return err
		}
		if b, ok := tc["add_prefix_space"].(bool); ok {
			kv.add(gguf.Bool("tokenizer.ggml.add_space_prefix", b))
		}
	}
	var tj struct {
		Model struct {
			Type         string `json:"type"`
			ByteFallback bool   `json:"byte_fallback"`
		} `json:"model"`
		Decoder map[string]any `json:"decoder"`
	}
	if p := filepath.Join(m.dir, "tokenizer.json"); fileExists(p) {
		if err := readJSONFile(p, &tj); err != nil {
			return err
		}
		if tj.Model.Type == "BPE" && tj.Model.ByteFallback && tj.Decoder["type"] == "Sequence" {
			return errf(p, "", -1, ErrTokenizer, "Llama-2 style byte-fallback BPE (llama_hf vocab) is not supported")
		}
	}
	if err := m.gpt2Vocab(kv, f.pre); err != nil {
		return err
	}
	if v, ok := m.int("vocab_size"); ok && v == 49152 {
		kv.add(gguf.Bool("tokenizer.ggml.add_bos_token", false))
	}
	return nil
}
