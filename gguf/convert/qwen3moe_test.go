package convert

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// writeQwen3MoE writes a tiny Qwen3MoeForCausalLM checkpoint (internal/
// testmodel has no generator for it): 2 layers, 4 experts of width 32,
// per-expert tensors, values k·0.001 + tensor index, BF16, one file. The
// tokenizer comes from a testmodel Qwen3 checkpoint.
func writeQwen3MoE(t *testing.T) (dir string, vals map[string][]float32) {
	t.Helper()
	tok := t.TempDir()
	if _, err := (testmodel.Qwen3Options{}).Write(tok); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(t.TempDir(), "qwen3moe")
	os.MkdirAll(dir, 0o755)
	const H, E, I, V, L, hd = 64, 4, 32, 512, 2, 32
	shapes := map[string][]int64{"model.embed_tokens.weight": {V, H}, "model.norm.weight": {H}, "lm_head.weight": {V, H}}
	for l := 0; l < L; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		shapes[p+"input_layernorm.weight"] = []int64{H}
		shapes[p+"post_attention_layernorm.weight"] = []int64{H}
		shapes[p+"self_attn.q_proj.weight"] = []int64{2 * hd, H}
		shapes[p+"self_attn.k_proj.weight"] = []int64{hd, H}
		shapes[p+"self_attn.v_proj.weight"] = []int64{hd, H}
		shapes[p+"self_attn.o_proj.weight"] = []int64{H, 2 * hd}
		shapes[p+"self_attn.q_norm.weight"] = []int64{hd}
		shapes[p+"self_attn.k_norm.weight"] = []int64{hd}
		shapes[p+"mlp.gate.weight"] = []int64{E, H}
		for e := 0; e < E; e++ {
			shapes[fmt.Sprintf("%smlp.experts.%d.gate_proj.weight", p, e)] = []int64{I, H}
			shapes[fmt.Sprintf("%smlp.experts.%d.up_proj.weight", p, e)] = []int64{I, H}
			shapes[fmt.Sprintf("%smlp.experts.%d.down_proj.weight", p, e)] = []int64{H, I}
		}
	}
	var specs []safetensors.TensorSpec
	for n, s := range shapes {
		specs = append(specs, safetensors.TensorSpec{Name: n, DType: tensor.BF16, Shape: s})
	}
	w, err := safetensors.Create(filepath.Join(dir, "model.safetensors"), map[string]string{"format": "pt"}, specs)
	if err != nil {
		t.Fatal(err)
	}
	vals = map[string][]float32{}
	for k := 0; !w.Done(); k++ {
		name := w.Next()
		n, _ := tensor.NumElements(shapes[name])
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(k) + float32(i%997)*0.001
		}
		b := make([]byte, 2*n)
		tensor.F32ToBF16(b, v)
		tensor.BF16ToF32(v, b)
		vals[name] = v
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, _ := os.ReadFile(filepath.Join(tok, f))
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	cfg := map[string]any{
		"architectures": []string{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe", "hidden_size": H,
		"intermediate_size": 96, "moe_intermediate_size": I, "num_experts": E, "num_experts_per_tok": 2,
		"num_hidden_layers": L, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": hd,
		"vocab_size": V, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
		"norm_topk_prob": true, "bos_token_id": 509, "eos_token_id": 511, "tie_word_embeddings": false,
	}
	b, _ := jsonMarshal(cfg)
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
	return dir, vals
}

func TestQwen3MoE(t *testing.T) {
	dir, vals := writeQwen3MoE(t)
	out, _ := convertDir(t, dir, Options{}, WriteOptions{Jobs: 2})
	f := openGGUF(t, out)
	if f.Architecture() != "qwen3moe" {
		t.Fatalf("architecture %s", f.Architecture())
	}
	for key, want := range map[string]uint64{"qwen3moe.expert_count": 4, "qwen3moe.expert_used_count": 2, "qwen3moe.expert_feed_forward_length": 32, "qwen3moe.block_count": 2} {
		if got, ok := kvUint(t, f, key); !ok || got != want {
			t.Errorf("%s = %d (%v), want %d", key, got, ok, want)
		}
	}
	// {arch}.expert_feed_forward_length follows general.file_type
	// (Qwen2MoeModel adds it after TextModel's keys).
	var order []string
	for _, kv := range f.KVs {
		order = append(order, kv.Key)
	}
	ft, eff := -1, -1
	for i, k := range order {
		switch k {
		case "general.file_type":
			ft = i
		case "qwen3moe.expert_feed_forward_length":
			eff = i
		}
	}
	if !(ft >= 0 && eff == ft+1) {
		t.Errorf("key order %v", order)
	}
	for l := 0; l < 2; l++ {
		for _, w := range []string{"gate", "up", "down"} {
			var want []float32
			for e := 0; e < 4; e++ {
				want = append(want, vals[fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, w)]...)
			}
			name := fmt.Sprintf("blk.%d.ffn_%s_exps.weight", l, w)
			sameValues(t, name, values(t, f, name), asF16(want))
		}
		if ti, _ := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", l)); ti.Type != quant.F32 {
			t.Errorf("router %s", ti.Type)
		}
	}
	// The stacked tensors are emitted down, gate, up, right after the
	// layer's last expert tensor in name order.
	var names []string
	for _, ti := range f.Tensors {
		names = append(names, ti.Name)
	}
	for i, n := range names {
		if n == "blk.0.ffn_down_exps.weight" {
			if i+2 >= len(names) || names[i+1] != "blk.0.ffn_gate_exps.weight" || names[i+2] != "blk.0.ffn_up_exps.weight" {
				t.Errorf("expert order around %d: %v", i, names)
			}
		}
	}
	// gguf.size_label: 4 experts × (91,072 shared + 12,288 per-expert
	// parameters) → "4x103K".
	if s, _ := f.KV("general.size_label"); s.Value != "4x103K" {
		t.Errorf("size label %v", s.Value)
	}
}
