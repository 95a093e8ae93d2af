package testmodel

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

func TestCompressedPackLayout(t *testing.T) {
	// compressed-tensors pack_to_int32: element j at bit j·bits of the
	// row's LSB-first stream, little-endian words.
	cases := []struct {
		bits int
		u    []uint32
		want []uint32
	}{
		{4, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, []uint32{0x87654321}},
		{8, []uint32{0x11, 0x22, 0x33, 0xff}, []uint32{0xff332211}},
		{2, []uint32{3, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, []uint32{0x40000093}},
	}
	for _, tc := range cases {
		got := CompressedPack(tc.u, 1, int64(len(tc.u)), tc.bits)
		for i, w := range tc.want {
			if g := binary.LittleEndian.Uint32(got[4*i:]); g != w {
				t.Errorf("bits %d word %d = %#x, want %#x", tc.bits, i, g, w)
			}
		}
	}
	// 3 bits: 10 values per word (2 padding bits), none straddles a word;
	// 32 values take ceil(32/10) = 4 words, the last padded.
	u := make([]uint32, 32)
	u[9], u[10], u[31] = 7, 5, 3 // word 0 bits 27–29, word 1 bits 0–2, word 3 bits 3–5
	got := CompressedPack(u, 1, 32, 3)
	if len(got) != 16 || CompressedPackedCols(32, 3) != 4 {
		t.Fatalf("3-bit: %d bytes, cols %d; want 16 bytes, 4 cols", len(got), CompressedPackedCols(32, 3))
	}
	for i, w := range []uint32{7 << 27, 5, 0, 3 << 3} {
		if g := binary.LittleEndian.Uint32(got[4*i:]); g != w {
			t.Errorf("3-bit word %d = %#x, want %#x", i, g, w)
		}
	}
}

func TestCompressedDequantizeRoundTrip(t *testing.T) {
	for _, bits := range []int{2, 3, 4, 5, 6, 8} {
		const out, in, group = 3, 64, 32
		r := &compressedRand{s: uint64(bits)}
		u := make([]uint32, out*in)
		for i := range u {
			u[i] = uint32(r.next() >> (64 - bits))
		}
		scales := make([]float32, out*in/group)
		for i := range scales {
			scales[i] = 0.25 * float32(i+1)
		}
		sb := make([]byte, 4*len(scales))
		tensor.F32ToBytes(sb, scales)
		w, err := CompressedDequantize(CompressedPack(u, out, in, bits), sb, tensor.F32, out, in, bits, group)
		if err != nil {
			t.Fatal(err)
		}
		for i := range w {
			want := float32(int64(u[i])-int64(1)<<(bits-1)) * scales[i/in*(in/group)+i%in/group]
			if w[i] != want {
				t.Fatalf("bits %d element %d = %g, want %g", bits, i, w[i], want)
			}
		}
	}
}

func TestCompressedFixtures(t *testing.T) {
	cases := []struct {
		name    string
		c       func(uint64) *CompressedCheckpoint
		model   string
		shards  int
		modules int
	}{
		{"deepseek_v3", CompressedDeepSeekV3, "deepseek_v3", 3, 12},
		{"qwen3", CompressedQwen3, "qwen3", 2, 14},
		{"qwen3_moe", CompressedQwen3MoE, "qwen3_moe", 4, 32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "m")
			if err := tc.c(7).Write(dir); err != nil {
				t.Fatal(err)
			}
			ck, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if ck.Config.ModelType != tc.model || len(ck.Shards) != tc.shards {
				t.Errorf("model_type %q, %d shards", ck.Config.ModelType, len(ck.Shards))
			}
			qc, ok := ck.Config.Raw["quantization_config"].(map[string]any)
			if !ok || qc["quant_method"] != "compressed-tensors" || qc["format"] != "pack-quantized" {
				t.Errorf("quantization_config %v", qc)
			}
			packed := 0
			for _, l := range ck.Tensors() {
				mod, ok := strings.CutSuffix(l.Info.Name, ".weight_packed")
				if !ok {
					if !strings.HasSuffix(l.Info.Name, "_scale") && !strings.HasSuffix(l.Info.Name, "_shape") && l.Info.DType != tensor.BF16 && l.Info.DType != tensor.F32 {
						t.Errorf("%s: %s", l.Info.Name, l.Info.DType)
					}
					continue
				}
				packed++
				sh, _ := ck.Lookup(mod + ".weight_shape")
				b, _ := io.ReadAll(sh.Section())
				out, in := int64(binary.LittleEndian.Uint64(b)), int64(binary.LittleEndian.Uint64(b[8:]))
				if l.Info.DType != tensor.I32 || l.Info.Shape[0] != out || l.Info.Shape[1] != in/8 {
					t.Errorf("%s: %s %v for shape [%d %d]", l.Info.Name, l.Info.DType, l.Info.Shape, out, in)
				}
				sc, _ := ck.Lookup(mod + ".weight_scale")
				if sc.Info.DType != tensor.BF16 || sc.Info.Shape[0] != out || sc.Info.Shape[1] != in/32 {
					t.Errorf("%s: %s %v", sc.Info.Name, sc.Info.DType, sc.Info.Shape)
				}
			}
			if packed != tc.modules {
				t.Errorf("%d packed modules, want %d", packed, tc.modules)
			}
			for _, f := range []string{"tokenizer.json", "generation_config.json", "config.json"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

func TestCompressedDeterministic(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	if err := CompressedDeepSeekV3(5).Write(a); err != nil {
		t.Fatal(err)
	}
	if err := CompressedDeepSeekV3(5).Write(b); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(a)
	for _, e := range ents {
		x, _ := os.ReadFile(filepath.Join(a, e.Name()))
		y, _ := os.ReadFile(filepath.Join(b, e.Name()))
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between runs", e.Name())
		}
	}
	c := filepath.Join(t.TempDir(), "c")
	if err := CompressedDeepSeekV3(6).Write(c); err != nil {
		t.Fatal(err)
	}
	x, _ := os.ReadFile(filepath.Join(a, "model-00002-of-00003.safetensors"))
	y, _ := os.ReadFile(filepath.Join(c, "model-00002-of-00003.safetensors"))
	if bytes.Equal(x, y) {
		t.Error("the seed changes nothing")
	}
}
