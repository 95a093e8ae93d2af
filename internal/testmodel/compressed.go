package testmodel

// Compressed-tensors ("pack-quantized") fixtures: tiny checkpoints laid out
// the way llm-compressor writes them, for the MLX repack tests.
//
// This file is self-contained on purpose (only safetensors, tensor and the
// standard library) so it compiles whatever state the rest of the package is
// in; every exported name starts with Compressed.
//
// Layout facts (vllm-project/compressed-tensors, pack_quantized):
//   - <M>.weight_packed  I32 [out, in·bits/32]: u = q + 2^(bits−1), packed
//     along the input dim LSB first (element j at bit j·bits of the row);
//   - <M>.weight_scale   model float dtype [out, in/group_size];
//   - <M>.weight_shape   I64 [2] holding (out, in);
//   - dequantization W = (u − 2^(bits−1)) · scale.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// CompressedTensor is one tensor of a fixture, bytes in memory (fixtures
// are tiny).
type CompressedTensor struct {
	Name  string
	DType tensor.DType
	Shape []int64
	Data  []byte
	Shard int // index into the checkpoint's shard list
}

// CompressedCheckpoint is a fixture before it is written. Tests may edit
// Config, Tensors and Files to make bad inputs.
type CompressedCheckpoint struct {
	Config  map[string]any
	Shards  int                 // number of shard files (1 → model.safetensors, no index)
	Tensors []*CompressedTensor // in write order within each shard
	Files   map[string][]byte   // other files: tokenizer, generation_config.json, *.py
}

// CompressedScheme is one config group's weight arguments.
type CompressedScheme struct {
	Bits, GroupSize int
}

// compressedRand is splitmix64: deterministic on every platform.
type compressedRand struct{ s uint64 }

func (r *compressedRand) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float in [-1, 1).
func (r *compressedRand) float() float32 {
	return float32(r.next()>>40)/float32(1<<24)*2 - 1
}

func (c *CompressedCheckpoint) add(shard int, name string, dt tensor.DType, shape []int64, data []byte) {
	c.Tensors = append(c.Tensors, &CompressedTensor{Name: name, DType: dt, Shape: shape, Data: data, Shard: shard})
}

// addFloat adds a BF16 (or F32) tensor of random values scaled by amp.
func (c *CompressedCheckpoint) addFloat(r *compressedRand, shard int, name string, dt tensor.DType, amp float32, shape ...int64) {
	n, _ := tensor.NumElements(shape)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = r.float() * amp
	}
	size, _ := tensor.ByteSize(dt, shape)
	data := make([]byte, size)
	if err := tensor.FromF32(dt, data, vals); err != nil {
		panic(err)
	}
	c.add(shard, name, dt, shape, data)
}

// addPacked adds <module>.weight_packed, .weight_scale and .weight_shape for
// a [out, in] weight quantized with s (symmetric int, group strategy).
func (c *CompressedCheckpoint) addPacked(r *compressedRand, shard int, module string, s CompressedScheme, out, in int64) {
	u := make([]uint32, out*in)
	for i := range u {
		u[i] = uint32(r.next() >> (64 - s.Bits))
	}
	c.add(shard, module+".weight_packed", tensor.I32, []int64{out, CompressedPackedCols(in, s.Bits)}, CompressedPack(u, out, in, s.Bits))
	groups := in / int64(s.GroupSize)
	scales := make([]float32, out*groups)
	for i := range scales {
		// Positive, spread over a few binades, like real scales.
		scales[i] = float32(math.Ldexp(float64(1+r.float()/2), -6-int(r.next()%4)))
	}
	sb := make([]byte, 2*len(scales))
	tensor.F32ToBF16(sb, scales)
	c.add(shard, module+".weight_scale", tensor.BF16, []int64{out, groups}, sb)
	shp := make([]byte, 16)
	binary.LittleEndian.PutUint64(shp[0:], uint64(out))
	binary.LittleEndian.PutUint64(shp[8:], uint64(in))
	c.add(shard, module+".weight_shape", tensor.I64, []int64{2}, shp)
}

// CompressedPack packs unsigned values u (row-major [out, in], each below
// 2^bits) the compressed-tensors way (pack_to_int32, packed_dim 1): each
// little-endian int32 holds pf = 32/bits consecutive values of a row, value
// k of the word at bit k·bits, the row padded with zeros to a multiple of
// pf. For bits dividing 32 (2, 4, 8) that is one LSB-first bit stream, the
// MLX layout; for 3, 5 or 6 bits every word keeps 32 mod bits padding bits
// and no value straddles two words.
func CompressedPack(u []uint32, out, in int64, bits int) []byte {
	words := CompressedPackedCols(in, bits)
	pf := int64(32 / bits)
	dst := make([]byte, out*words*4)
	for row := int64(0); row < out; row++ {
		for k := int64(0); k < words; k++ {
			var w uint32
			for j := int64(0); j < pf && k*pf+j < in; j++ {
				w |= u[row*in+k*pf+j] << (j * int64(bits))
			}
			binary.LittleEndian.PutUint32(dst[(row*words+k)*4:], w)
		}
	}
	return dst
}

// CompressedPackedCols is weight_packed's last dimension for in values of
// bits bits: ceil(in / (32/bits)).
func CompressedPackedCols(in int64, bits int) int64 {
	pf := int64(32 / bits)
	return (in + pf - 1) / pf
}

func compressedQuantConfig(s CompressedScheme, ignore []string) map[string]any {
	ig := make([]any, len(ignore))
	for i, v := range ignore {
		ig[i] = v
	}
	return map[string]any{
		"quant_method":        "compressed-tensors",
		"format":              "pack-quantized",
		"quantization_status": "compressed",
		"config_groups": map[string]any{
			"group_0": map[string]any{
				"targets":            []any{"Linear"},
				"input_activations":  nil,
				"output_activations": nil,
				"weights": map[string]any{
					"num_bits":   s.Bits,
					"type":       "int",
					"symmetric":  true,
					"strategy":   "group",
					"group_size": s.GroupSize,
					"actorder":   nil,
					"dynamic":    false,
				},
			},
		},
		"ignore":          ig,
		"kv_cache_scheme": nil,
		"sparsity_config": map[string]any{},
		"version":         "0.12.2",
	}
}

func compressedCommonFiles() map[string][]byte {
	return map[string][]byte{
		"tokenizer.json":         []byte(`{"version":"1.0","model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}}` + "\n"),
		"tokenizer_config.json":  []byte(`{"model_max_length":4096,"tokenizer_class":"PreTrainedTokenizerFast"}` + "\n"),
		"generation_config.json": []byte(`{"bos_token_id":0,"eos_token_id":1,"do_sample":true,"temperature":0.6}` + "\n"),
	}
}

// CompressedDeepSeekV3 is a tiny DeepSeek-V3-shaped MoE: MLA attention,
// layer 0 dense, layer 1 MoE with 4 routed experts packed int4 group 32
// (Kimi-K2-Thinking style) and everything else BF16, in 3 shards, with
// tokenizer files, generation_config.json and a remote-code *.py.
func CompressedDeepSeekV3(seed uint64) *CompressedCheckpoint {
	r := &compressedRand{s: seed}
	const (
		hidden, inter, moeInter = 64, 128, 32
		vocab, experts, heads   = 128, 4, 2
		qLora, kvLora           = 32, 32
		nope, rope, vdim        = 16, 8, 16
	)
	s := CompressedScheme{Bits: 4, GroupSize: 32}
	c := &CompressedCheckpoint{Shards: 3, Files: compressedCommonFiles()}
	c.Files["configuration_deepseek.py"] = []byte("# tiny fixture: remote code is linked, never run\nclass DeepseekV3Config: pass\n")
	c.Files["tiktoken.model"] = []byte("YQ== 0\nYg== 1\n")
	c.Config = map[string]any{
		"architectures":            []any{"DeepseekV3ForCausalLM"},
		"model_type":               "deepseek_v3",
		"auto_map":                 map[string]any{"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
		"hidden_size":              hidden,
		"intermediate_size":        inter,
		"moe_intermediate_size":    moeInter,
		"num_hidden_layers":        2,
		"first_k_dense_replace":    1,
		"moe_layer_freq":           1,
		"n_routed_experts":         experts,
		"n_shared_experts":         1,
		"num_experts_per_tok":      2,
		"n_group":                  1,
		"topk_group":               1,
		"num_attention_heads":      heads,
		"num_key_value_heads":      heads,
		"q_lora_rank":              qLora,
		"kv_lora_rank":             kvLora,
		"qk_nope_head_dim":         nope,
		"qk_rope_head_dim":         rope,
		"v_head_dim":               vdim,
		"vocab_size":               vocab,
		"max_position_embeddings":  4096,
		"rms_norm_eps":             1e-6,
		"rope_theta":               50000.0,
		"routed_scaling_factor":    2.5,
		"scoring_func":             "sigmoid",
		"topk_method":              "noaux_tc",
		"norm_topk_prob":           true,
		"num_nextn_predict_layers": 0,
		"tie_word_embeddings":      false,
		"torch_dtype":              "bfloat16",
		"quantization_config": compressedQuantConfig(s, []string{
			"lm_head", `re:.*self_attn.*`, `re:.*shared_experts.*`, `re:.*mlp\.(gate|up|gate_up|down)_proj.*`,
		}),
	}
	bf := tensor.BF16
	c.addFloat(r, 0, "model.embed_tokens.weight", bf, 0.5, vocab, hidden)
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		sh := l // layer 0 in shard 0, layer 1 in shard 1
		c.addFloat(r, sh, p+"input_layernorm.weight", bf, 1, hidden)
		c.addFloat(r, sh, p+"post_attention_layernorm.weight", bf, 1, hidden)
		a := p + "self_attn."
		c.addFloat(r, sh, a+"q_a_proj.weight", bf, 0.1, qLora, hidden)
		c.addFloat(r, sh, a+"q_a_layernorm.weight", bf, 1, qLora)
		c.addFloat(r, sh, a+"q_b_proj.weight", bf, 0.1, heads*(nope+rope), qLora)
		c.addFloat(r, sh, a+"kv_a_proj_with_mqa.weight", bf, 0.1, kvLora+rope, hidden)
		c.addFloat(r, sh, a+"kv_a_layernorm.weight", bf, 1, kvLora)
		c.addFloat(r, sh, a+"kv_b_proj.weight", bf, 0.1, heads*(nope+vdim), kvLora)
		c.addFloat(r, sh, a+"o_proj.weight", bf, 0.1, hidden, heads*vdim)
		if l == 0 {
			for _, m := range []string{"gate_proj", "up_proj"} {
				c.addFloat(r, sh, p+"mlp."+m+".weight", bf, 0.1, inter, hidden)
			}
			c.addFloat(r, sh, p+"mlp.down_proj.weight", bf, 0.1, hidden, inter)
			continue
		}
		c.addFloat(r, sh, p+"mlp.gate.weight", bf, 0.1, experts, hidden)
		c.addFloat(r, sh, p+"mlp.gate.e_score_correction_bias", tensor.F32, 0.1, experts)
		for e := 0; e < experts; e++ {
			x := fmt.Sprintf("%smlp.experts.%d.", p, e)
			ssh := 1 + e/2 // experts 0–1 in shard 1, 2–3 in shard 2: a module never straddles shards
			c.addPacked(r, ssh, x+"gate_proj", s, moeInter, hidden)
			c.addPacked(r, ssh, x+"up_proj", s, moeInter, hidden)
			c.addPacked(r, ssh, x+"down_proj", s, hidden, moeInter)
		}
		for _, m := range []string{"gate_proj", "up_proj"} {
			c.addFloat(r, sh, p+"mlp.shared_experts."+m+".weight", bf, 0.1, moeInter, hidden)
		}
		c.addFloat(r, sh, p+"mlp.shared_experts.down_proj.weight", bf, 0.1, hidden, moeInter)
	}
	c.addFloat(r, 2, "model.norm.weight", bf, 1, hidden)
	c.addFloat(r, 2, "lm_head.weight", bf, 0.1, vocab, hidden)
	return c
}

// CompressedQwen3 is a tiny dense Qwen3 with every decoder Linear packed
// (W4A16 group 32 by default, as llm-compressor's recipes write them),
// embeddings, norms and lm_head in BF16, in 2 shards.
func CompressedQwen3(seed uint64) *CompressedCheckpoint {
	return CompressedQwen3With(seed, CompressedScheme{Bits: 4, GroupSize: 32}, nil)
}

// CompressedQwen3With is CompressedQwen3 quantized with s; when down is not
// nil the mlp.down_proj modules use it instead, declared by a second config
// group ("group_1", targets re:.*mlp\.down_proj$), as llm-compressor writes
// mixed recipes.
func CompressedQwen3With(seed uint64, s CompressedScheme, down *CompressedScheme) *CompressedCheckpoint {
	r := &compressedRand{s: seed}
	const hidden, inter, vocab, heads, kvHeads, headDim = 64, 128, 128, 2, 1, 32
	ds := s
	if down != nil {
		ds = *down
	}
	c := &CompressedCheckpoint{Shards: 2, Files: compressedCommonFiles()}
	c.Config = map[string]any{
		"architectures":           []any{"Qwen3ForCausalLM"},
		"model_type":              "qwen3",
		"hidden_size":             hidden,
		"intermediate_size":       inter,
		"num_hidden_layers":       2,
		"num_attention_heads":     heads,
		"num_key_value_heads":     kvHeads,
		"head_dim":                headDim,
		"vocab_size":              vocab,
		"max_position_embeddings": 4096,
		"rms_norm_eps":            1e-6,
		"rope_theta":              1000000.0,
		"tie_word_embeddings":     false,
		"torch_dtype":             "bfloat16",
		"quantization_config":     compressedQuantConfig(s, []string{"lm_head"}),
	}
	bf := tensor.BF16
	c.addFloat(r, 0, "model.embed_tokens.weight", bf, 0.5, vocab, hidden)
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		c.addFloat(r, l, p+"input_layernorm.weight", bf, 1, hidden)
		c.addFloat(r, l, p+"post_attention_layernorm.weight", bf, 1, hidden)
		c.addFloat(r, l, p+"self_attn.q_norm.weight", bf, 1, headDim)
		c.addFloat(r, l, p+"self_attn.k_norm.weight", bf, 1, headDim)
		c.addPacked(r, l, p+"self_attn.q_proj", s, heads*headDim, hidden)
		c.addPacked(r, l, p+"self_attn.k_proj", s, kvHeads*headDim, hidden)
		c.addPacked(r, l, p+"self_attn.v_proj", s, kvHeads*headDim, hidden)
		c.addPacked(r, l, p+"self_attn.o_proj", s, hidden, heads*headDim)
		c.addPacked(r, l, p+"mlp.gate_proj", s, inter, hidden)
		c.addPacked(r, l, p+"mlp.up_proj", s, inter, hidden)
		c.addPacked(r, l, p+"mlp.down_proj", ds, hidden, inter)
	}
	c.addFloat(r, 1, "model.norm.weight", bf, 1, hidden)
	c.addFloat(r, 1, "lm_head.weight", bf, 0.1, vocab, hidden)
	if down != nil {
		qc := c.Config["quantization_config"].(map[string]any)
		g1 := compressedQuantConfig(ds, nil)["config_groups"].(map[string]any)["group_0"].(map[string]any)
		g1["targets"] = []any{`re:.*mlp\.down_proj$`}
		qc["config_groups"].(map[string]any)["group_1"] = g1
	}
	return c
}

// CompressedQwen3MoE is a tiny Qwen3-MoE (model_type qwen3_moe): both
// layers sparse with 4 routed experts, every decoder Linear packed (W4A16
// group 32 by default) except the router (mlp.gate, ignored as
// llm-compressor's MoE recipes do), in 4 shards: the embeddings alone in
// shard 0 (a shard --rewrite leaves alone), layer 0 in shard 1, layer 1 in
// shard 2 with experts 2–3 of it in shard 3 beside the final norm and
// lm_head (a switch_mlp stack gathered across shards).
func CompressedQwen3MoE(seed uint64) *CompressedCheckpoint {
	return CompressedQwen3MoEWith(seed, CompressedScheme{Bits: 4, GroupSize: 32}, nil)
}

// CompressedQwen3MoEWith is CompressedQwen3MoE quantized with s; when down
// is not nil the experts' down_proj modules use it instead, declared by a
// second config group ("group_1", targets re:.*experts\.\d+\.down_proj$).
func CompressedQwen3MoEWith(seed uint64, s CompressedScheme, down *CompressedScheme) *CompressedCheckpoint {
	r := &compressedRand{s: seed}
	const hidden, moeInter, vocab, heads, kvHeads, headDim, experts = 64, 64, 128, 2, 1, 32, 4
	ds := s
	if down != nil {
		ds = *down
	}
	c := &CompressedCheckpoint{Shards: 4, Files: compressedCommonFiles()}
	c.Config = map[string]any{
		"architectures":           []any{"Qwen3MoeForCausalLM"},
		"model_type":              "qwen3_moe",
		"hidden_size":             hidden,
		"intermediate_size":       128,
		"moe_intermediate_size":   moeInter,
		"num_hidden_layers":       2,
		"num_attention_heads":     heads,
		"num_key_value_heads":     kvHeads,
		"head_dim":                headDim,
		"num_experts":             experts,
		"num_experts_per_tok":     2,
		"decoder_sparse_step":     1,
		"mlp_only_layers":         []any{},
		"norm_topk_prob":          true,
		"vocab_size":              vocab,
		"max_position_embeddings": 4096,
		"rms_norm_eps":            1e-6,
		"rope_theta":              1000000.0,
		"tie_word_embeddings":     false,
		"torch_dtype":             "bfloat16",
		"quantization_config":     compressedQuantConfig(s, []string{"lm_head", `re:.*mlp\.gate$`}),
	}
	bf := tensor.BF16
	c.addFloat(r, 0, "model.embed_tokens.weight", bf, 0.5, vocab, hidden)
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		sh := 1 + l
		c.addFloat(r, sh, p+"input_layernorm.weight", bf, 1, hidden)
		c.addFloat(r, sh, p+"post_attention_layernorm.weight", bf, 1, hidden)
		c.addFloat(r, sh, p+"self_attn.q_norm.weight", bf, 1, headDim)
		c.addFloat(r, sh, p+"self_attn.k_norm.weight", bf, 1, headDim)
		c.addPacked(r, sh, p+"self_attn.q_proj", s, heads*headDim, hidden)
		c.addPacked(r, sh, p+"self_attn.k_proj", s, kvHeads*headDim, hidden)
		c.addPacked(r, sh, p+"self_attn.v_proj", s, kvHeads*headDim, hidden)
		c.addPacked(r, sh, p+"self_attn.o_proj", s, hidden, heads*headDim)
		c.addFloat(r, sh, p+"mlp.gate.weight", bf, 0.1, experts, hidden)
		for e := 0; e < experts; e++ {
			x := fmt.Sprintf("%smlp.experts.%d.", p, e)
			esh := sh
			if l == 1 && e >= 2 {
				esh = 3
			}
			// Hugging Face's order within an expert: down, gate, up.
			c.addPacked(r, esh, x+"down_proj", ds, hidden, moeInter)
			c.addPacked(r, esh, x+"gate_proj", s, moeInter, hidden)
			c.addPacked(r, esh, x+"up_proj", s, moeInter, hidden)
		}
	}
	c.addFloat(r, 3, "model.norm.weight", bf, 1, hidden)
	c.addFloat(r, 3, "lm_head.weight", bf, 0.1, vocab, hidden)
	if down != nil {
		qc := c.Config["quantization_config"].(map[string]any)
		g1 := compressedQuantConfig(ds, nil)["config_groups"].(map[string]any)["group_0"].(map[string]any)
		g1["targets"] = []any{`re:.*experts\.\d+\.down_proj$`}
		qc["config_groups"].(map[string]any)["group_1"] = g1
	}
	return c
}

// Find returns the named tensor, or nil.
func (c *CompressedCheckpoint) Find(name string) *CompressedTensor {
	for _, t := range c.Tensors {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Remove drops the named tensor; it reports whether it was there.
func (c *CompressedCheckpoint) Remove(name string) bool {
	for i, t := range c.Tensors {
		if t.Name == name {
			c.Tensors = append(c.Tensors[:i], c.Tensors[i+1:]...)
			return true
		}
	}
	return false
}

// QuantWeights returns config_groups.<group>.weights for editing.
func (c *CompressedCheckpoint) QuantWeights(group string) map[string]any {
	qc := c.Config["quantization_config"].(map[string]any)
	return qc["config_groups"].(map[string]any)[group].(map[string]any)["weights"].(map[string]any)
}

// ShardNames are the file names Write uses.
func (c *CompressedCheckpoint) ShardNames() []string {
	if c.Shards == 1 {
		return []string{safetensors.SingleName}
	}
	out := make([]string, c.Shards)
	for i := range out {
		out[i] = safetensors.ShardName(i+1, c.Shards)
	}
	return out
}

// Write writes the checkpoint into dir (created if needed): shards, the
// index (when sharded), config.json and the other files.
func (c *CompressedCheckpoint) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names := c.ShardNames()
	weightMap := map[string]string{}
	var total int64
	for i, name := range names {
		var specs []safetensors.TensorSpec
		var data [][]byte
		for _, t := range c.Tensors {
			if t.Shard != i {
				continue
			}
			specs = append(specs, safetensors.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape})
			data = append(data, t.Data)
			weightMap[t.Name] = name
			total += int64(len(t.Data))
		}
		w, err := safetensors.Create(filepath.Join(dir, name), map[string]string{"format": "pt"}, specs)
		if err != nil {
			return err
		}
		for _, d := range data {
			if _, err := w.Write(d); err != nil {
				w.Abort()
				return err
			}
		}
		if err := w.Close(); err != nil {
			return err
		}
	}
	if len(names) > 1 {
		if err := safetensors.WriteIndex(dir, weightMap, total, nil); err != nil {
			return err
		}
	}
	cfg, err := json.MarshalIndent(c.Config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), append(cfg, '\n'), 0o644); err != nil {
		return err
	}
	files := make([]string, 0, len(c.Files))
	for f := range c.Files {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), c.Files[f], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// CompressedDequantize is the compressed-tensors dequantization of one
// packed module, as float64 values rounded to the scale dtype and returned
// as float32: W[o][i] = (u − 2^(bits−1)) · scale[o][i/group]. packed is the
// weight_packed bytes ([out, ceil(in/(32/bits))] little-endian I32, laid
// out as CompressedPack does), scale the
// weight_scale bytes of dtype sdt ([out, in/group]).
func CompressedDequantize(packed, scale []byte, sdt tensor.DType, out, in int64, bits, group int) ([]float32, error) {
	words := CompressedPackedCols(in, bits)
	pf := int64(32 / bits)
	if int64(len(packed)) != out*words*4 {
		return nil, fmt.Errorf("packed: %d bytes, want %d", len(packed), out*words*4)
	}
	groups := in / int64(group)
	sc := make([]float32, out*groups)
	if err := tensor.ToF32(sdt, sc, scale); err != nil {
		return nil, err
	}
	mask := uint64(1)<<bits - 1
	offset := int64(1) << (bits - 1)
	res := make([]float32, out*in)
	one := make([]byte, 4)
	for o := int64(0); o < out; o++ {
		row := packed[o*words*4 : (o+1)*words*4]
		for i := int64(0); i < in; i++ {
			word := uint64(binary.LittleEndian.Uint32(row[i/pf*4:]))
			u := int64((word >> (i % pf * int64(bits))) & mask)
			w := float64(u-offset) * float64(sc[o*groups+i/int64(group)])
			// Round to the scale dtype, as torch computes in it.
			if err := tensor.FromF32(sdt, one[:sizeOf(sdt)], []float32{float32(w)}); err != nil {
				return nil, err
			}
			v := make([]float32, 1)
			if err := tensor.ToF32(sdt, v, one[:sizeOf(sdt)]); err != nil {
				return nil, err
			}
			res[o*in+i] = v[0]
		}
	}
	return res, nil
}

func sizeOf(d tensor.DType) int { return d.Bits() / 8 }
