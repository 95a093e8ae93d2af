package testmodel

import (
	"fmt"
	"strconv"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// GGUFOptions describe a generated F16 GGUF file of a Qwen3.5-shaped
// model with full attention in every block (what the quantizer reads:
// names, widths and bytes; not a model llama.cpp would run), for
// quantizer tests and benchmarks too large to keep in testdata. Its keys
// are the ones llama.cpp's loader needs, so llama-quantize reads it too. Norms are
// F32, matrices F16 with values N(0, 0.02²), every tensor repeating its
// first 64Ki values so that gigabytes are cheap to write.
type GGUFOptions struct {
	Seed                    uint64
	Layers                  int // trunk blocks
	NextN                   bool
	Hidden, FF, Vocab       int
	Heads, KVHeads, HeadDim int
	Arch                    string // general.architecture (default qwen35)
}

// Wide27B is Qwen3.5-27B's widths (n_embd 5120, n_ff 17408, 24 heads of
// 256, 4 KV heads) with layers trunk blocks, an MTP block and a 32768
// vocabulary (the real 248320 would add 4.4 GB of embeddings): 0.75 GB of
// F16 a block, 0.67 GB of embeddings and output.
func Wide27B(layers int) GGUFOptions {
	return GGUFOptions{Layers: layers, NextN: true, Hidden: 5120, FF: 17408, Vocab: 32768, Heads: 24, KVHeads: 4, HeadDim: 256}
}

type ggufTensor struct {
	spec gguf.TensorSpec
	norm bool
}

func (o GGUFOptions) tensors() []ggufTensor {
	H, F, V := uint64(o.Hidden), uint64(o.FF), uint64(o.Vocab)
	q, kv := uint64(2*o.Heads*o.HeadDim), uint64(o.KVHeads*o.HeadDim)
	mat := func(name string, d ...uint64) ggufTensor {
		return ggufTensor{spec: gguf.TensorSpec{Name: name, Dims: d, Type: quant.F16}}
	}
	norm := func(name string, n uint64) ggufTensor {
		return ggufTensor{spec: gguf.TensorSpec{Name: name, Dims: []uint64{n}, Type: quant.F32}, norm: true}
	}
	ts := []ggufTensor{mat("token_embd.weight", H, V)}
	blocks := o.Layers
	if o.NextN {
		blocks++
	}
	for b := range blocks {
		p := "blk." + strconv.Itoa(b) + "."
		ts = append(ts,
			norm(p+"attn_norm.weight", H),
			mat(p+"attn_q.weight", H, q), mat(p+"attn_k.weight", H, kv), mat(p+"attn_v.weight", H, kv),
			norm(p+"attn_q_norm.weight", uint64(o.HeadDim)), norm(p+"attn_k_norm.weight", uint64(o.HeadDim)),
			mat(p+"attn_output.weight", q/2, H),
			norm(p+"post_attention_norm.weight", H),
			mat(p+"ffn_gate.weight", H, F), mat(p+"ffn_up.weight", H, F), mat(p+"ffn_down.weight", F, H))
		if b == o.Layers {
			ts = append(ts, mat(p+"nextn.eh_proj.weight", 2*H, H), norm(p+"nextn.enorm.weight", H),
				norm(p+"nextn.hnorm.weight", H), norm(p+"nextn.shared_head_norm.weight", H))
		}
	}
	return append(ts, norm("output_norm.weight", H), mat("output.weight", H, V))
}

func (o GGUFOptions) kvs() []gguf.KV {
	arch := o.Arch
	if arch == "" {
		arch = "qwen35"
	}
	u32 := func(k string, v int) gguf.KV { return gguf.KV{Key: k, Type: gguf.ValueUint32, Value: uint32(v)} }
	blocks, nextn := o.Layers, 0
	if o.NextN {
		blocks, nextn = o.Layers+1, 1
	}
	kvs := []gguf.KV{
		{Key: "general.architecture", Type: gguf.ValueString, Value: arch},
		{Key: "general.name", Type: gguf.ValueString, Value: "Generated"},
		u32(arch+".block_count", blocks),
		u32(arch+".embedding_length", o.Hidden),
		u32(arch+".feed_forward_length", o.FF),
		u32(arch+".attention.head_count", o.Heads),
		u32(arch+".attention.head_count_kv", o.KVHeads),
		u32(arch+".attention.key_length", o.HeadDim),
		u32(arch+".attention.value_length", o.HeadDim),
		// What llama.cpp's loader requires of a qwen35 file before it
		// quantizes it (llama_model::load_hparams); every block is full
		// attention (an interval of 1), as the tensors are.
		u32(arch+".context_length", 262144),
		gguf.F32(arch+".attention.layer_norm_rms_epsilon", 1e-6),
		gguf.I32s(arch+".rope.dimension_sections", []int32{11, 11, 10, 0}),
		u32(arch+".ssm.conv_kernel", 4),
		u32(arch+".ssm.inner_size", 2*o.Hidden),
		u32(arch+".ssm.state_size", 128),
		u32(arch+".ssm.time_step_rank", o.Heads),
		u32(arch+".ssm.group_count", o.KVHeads),
		u32(arch+".full_attention_interval", 1),
	}
	if nextn > 0 {
		kvs = append(kvs, u32(arch+".nextn_predict_layers", nextn))
	}
	return append(kvs, u32("general.file_type", 1), u32("general.quantization_version", 2))
}

// WriteGGUF writes the file to path (streamed: a few MiB of memory
// whatever its size) and returns its size.
func (o GGUFOptions) WriteGGUF(path string) (int64, error) {
	ts := o.tensors()
	specs := make([]gguf.TensorSpec, len(ts))
	for i, t := range ts {
		specs[i] = t.spec
	}
	l, err := gguf.PlanLayout(o.kvs(), specs, 0)
	if err != nil {
		return 0, err
	}
	w, err := gguf.Create(path, l, gguf.Options{})
	if err != nil {
		return 0, err
	}
	const block = 1 << 16
	chunk := make([]byte, 0, 32*block*2)
	for i, t := range ts {
		n := int64(l.Tensors[i].NumElements())
		init := NormalInit(0, 0.02)
		if t.norm {
			init = NormalInit(1, 0.1)
		}
		vals := Values(o.Seed, t.spec.Name, min(n, block), init, 0)
		es := int64(t.spec.Type.TypeSize())
		one := make([]byte, int64(len(vals))*es)
		if t.spec.Type == quant.F16 {
			tensor.F32ToF16(one, vals)
		} else {
			tensor.F32ToBytes(one, vals)
		}
		chunk = chunk[:0]
		for len(chunk)+len(one) <= cap(chunk) {
			chunk = append(chunk, one...)
		}
		size := n * es
		for off := int64(0); off < size; off += int64(len(chunk)) {
			if err := w.WriteAt(i, chunk[:min(int64(len(chunk)), size-off)], off); err != nil {
				w.Abort()
				return 0, err
			}
		}
		if err := w.Finish(i); err != nil {
			w.Abort()
			return 0, err
		}
	}
	if err := w.Close(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return l.Size, nil
}
