package convert

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/safetensors"
)

// TestDefaultPolicy: convert_hf_to_gguf.py's rules, per tensor.
func TestDefaultPolicy(t *testing.T) {
	for _, tt := range []struct {
		name string
		dims []uint64
		want quant.Type
		got  quant.Type
	}{
		{"blk.0.attn_q.weight", []uint64{64, 128}, quant.Q8_0, quant.Q8_0},
		{"blk.0.attn_q.weight", []uint64{64, 128}, quant.BF16, quant.BF16},
		{"token_embd.weight", []uint64{64, 1000}, quant.F16, quant.F16},
		{"blk.0.attn_q.weight", []uint64{48, 128}, quant.Q8_0, quant.F16}, // 48 % 32 ≠ 0
		{"blk.0.attn_q.weight", []uint64{48, 128}, quant.F16, quant.F16},
		{"blk.0.attn_norm.weight", []uint64{64}, quant.Q8_0, quant.F32},       // 1-D
		{"blk.0.attn_q_norm.weight", []uint64{64, 1}, quant.F16, quant.F32},   // *_norm.weight
		{"blk.3.ffn_gate_inp.weight", []uint64{64, 8}, quant.Q8_0, quant.F32}, // MoE router
		{"blk.3.ffn_gate_inp_shexp.weight", []uint64{64, 1}, quant.F16, quant.F32},
		{"blk.2.ssm_conv1d.weight", []uint64{4, 64}, quant.F16, quant.F32},
		{"position_embd.weight", []uint64{64, 512}, quant.F16, quant.F32},
		{"token_types.weight", []uint64{64, 2}, quant.F16, quant.F32},
		{"blk.2.ssm_a", []uint64{4, 4}, quant.F16, quant.F32},                  // no .weight suffix
		{"blk.2.ssm_dt.bias", []uint64{32, 2}, quant.F16, quant.F32},           // no .weight suffix
		{"blk.0.attn_q.lora_a", []uint64{64, 8}, quant.Q8_0, quant.Q8_0},       // LoRA suffixes count as weights
		{"ffn_gate_inp.weight", []uint64{64, 8}, quant.Q8_0, quant.Q8_0},       // no block: not the router rule
		{"blk.0.ffn_gate_inp.weight.x", []uint64{64, 8}, quant.F16, quant.F32}, // suffix rule
	} {
		if got := DefaultPolicy(quant.Tensor{Name: tt.name, Dims: tt.dims}, tt.want); got != tt.got {
			t.Errorf("%s %v asked %s: %s, want %s", tt.name, tt.dims, tt.want, got, tt.got)
		}
	}
}

// A policy in Options decides the types the plan and the file get; the
// writer encodes whatever it chose, and a choice it cannot encode, or whose
// blocks do not divide a row, is refused at plan time as bad options.
func TestPolicyOption(t *testing.T) {
	ck, err := safetensors.OpenDir(qwen35Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	// Q8_0 everywhere the default allows a quantized type, but the
	// embedding and output kept at F16.
	mixed := func(t quant.Tensor, want quant.Type) quant.Type {
		if t.Name == "token_embd.weight" || t.Name == "output.weight" {
			return quant.F16
		}
		return DefaultPolicy(t, quant.Q8_0)
	}
	out, p := convertDir(t, qwen35Dir, Options{Policy: mixed}, WriteOptions{Jobs: 2})
	f := openGGUF(t, out)
	var q8 int
	for _, tp := range p.Tensors {
		want := mixed(quant.Tensor{Name: tp.Name, Dims: tp.Dims}, quant.F16)
		if tp.Type != want {
			t.Errorf("%s: planned %s, policy says %s", tp.Name, tp.Type, want)
		}
		ti, ok := f.Tensor(tp.Name)
		if !ok || ti.Type != want {
			t.Errorf("%s: written as %v, want %s", tp.Name, ti.Type, want)
		}
		if want == quant.Q8_0 {
			q8++
		}
	}
	if ti, _ := f.Tensor("token_embd.weight"); ti.Type != quant.F16 || q8 == 0 {
		t.Errorf("token_embd %s, %d Q8_0 tensors", ti.Type, q8)
	}
	// The file equals a plain q8_0 conversion except where the policy
	// differs: token_embd's values are the F16 conversion's.
	f16, _ := convertDir(t, qwen35Dir, Options{}, WriteOptions{})
	sameValues(t, "token_embd.weight", values(t, f, "token_embd.weight"), values(t, openGGUF(t, f16), "token_embd.weight"))

	for _, tt := range []struct {
		name   string
		policy quant.Policy
		msg    string
	}{
		{"no encoder", func(t quant.Tensor, want quant.Type) quant.Type {
			if len(t.Dims) == 2 {
				return quant.IQ2_XXS
			}
			return quant.F32
		}, "cannot encode IQ2_XXS"},
		{"rows not whole blocks", func(t quant.Tensor, want quant.Type) quant.Type { return quant.Q8_0 }, "not a whole number of 32-value blocks"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPlan(ck, Options{Policy: tt.policy})
			var ce *Error
			if !errors.Is(err, ErrOptions) || !errors.As(err, &ce) || !ce.BadInput() || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want a bad-options error saying %q", err, tt.msg)
			}
		})
	}
}
