package quantize

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// The reference's mmproj (../convert/testdata/qwen35vl, PROVENANCE.md
// there) and llama-quantize's Q8_0 of it, which the reference did not ship:
// logs/mmproj-base-Q8_0.NOT_SHIPPED.sha256 holds its digest and size.
const (
	mmprojF16       = "../convert/testdata/qwen35vl/mmproj-base-F16.gguf"
	mmprojQ8_0SHA   = "7eaac82aed1a6f45669bd5b74c3f9891e676ed0e44ee0534231c91fbd24f1aea"
	mmprojQ8_0Bytes = 433152
)

// TestGoldenMMProjQ8_0: llama-quantize accepts an mmproj (a clip GGUF: no
// block_count, no head counts; its loader reads no hparams) and so does
// ferry, with the same bytes: the 10 linear weights Q8_0, the patch
// embedding halves kept F16 (".patch_embd" is never quantized), the F32
// tensors kept, tensors in the loader's name order, file type 7.
func TestGoldenMMProjQ8_0(t *testing.T) {
	f, p, err := plan(t, mmprojF16, Options{FileType: quant.FileQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "mmproj-Q8_0.gguf")
	if _, err := Run(context.Background(), f, p, out, RunOptions{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != mmprojQ8_0SHA || len(b) != mmprojQ8_0Bytes {
		t.Fatalf("%d bytes, sha256 %s; llama-quantize's: %d bytes, %s", len(b), got, mmprojQ8_0Bytes, mmprojQ8_0SHA)
	}
	counts := map[quant.Type]int{}
	for _, tp := range p.Tensors {
		counts[tp.Type]++
	}
	if counts[quant.Q8_0] != 10 || counts[quant.F16] != 2 || counts[quant.F32] != 22 {
		t.Errorf("types %v", counts)
	}
}

// TestMMProjQ4_K_M: the K-quant mix on an mmproj, as llama-quantize's rules
// at 34af94c give it with a CLIP model's hparams all 0 (n_layer 0, so
// use_more_bits(i, 0) holds for every ffn_down; n_gqa 0): attn_qkv is
// attn_v-like (the second of two gets Q6_K), ffn_down Q6_K, the rest
// Q4_K; every vision row of 64 or 128 values then falls back (Q4_K → Q5_0,
// Q6_K → Q8_0), and the merger's 256-wide rows keep Q4_K. No golden file
// exists for this type: the choice is checked, the encoders are the ones
// the text goldens check.
func TestMMProjQ4_K_M(t *testing.T) {
	_, p, err := plan(t, mmprojF16, Options{FileType: quant.FileQ4_K_M})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]quant.Type{
		"mm.0.weight": quant.Q4_K, "mm.2.weight": quant.Q4_K,
		"v.blk.0.attn_out.weight": quant.Q5_0, "v.blk.0.attn_qkv.weight": quant.Q5_0,
		"v.blk.0.ffn_down.weight": quant.Q8_0, "v.blk.0.ffn_up.weight": quant.Q5_0,
		"v.blk.1.attn_out.weight": quant.Q5_0, "v.blk.1.attn_qkv.weight": quant.Q8_0,
		"v.blk.1.ffn_down.weight": quant.Q8_0, "v.blk.1.ffn_up.weight": quant.Q5_0,
		"v.patch_embd.weight": quant.F16, "v.patch_embd.weight.1": quant.F16, "v.position_embd.weight": quant.F32,
	}
	for _, tp := range p.Tensors {
		w, ok := want[tp.Name]
		if !ok {
			w = quant.F32 // biases and norms: 1-D, never quantized
		}
		if tp.Type != w {
			t.Errorf("%s: %s, want %s", tp.Name, tp.Type, w)
		}
	}
}
