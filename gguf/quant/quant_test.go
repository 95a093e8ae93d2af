package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

func TestTypeTable(t *testing.T) {
	// (block, bytes) from GGML_QUANT_SIZES, gguf-py constants.py at 34af94c.
	want := map[string][2]int64{
		"F32": {1, 4}, "F16": {1, 2}, "BF16": {1, 2}, "Q4_0": {32, 18}, "Q4_1": {32, 20}, "Q5_0": {32, 22},
		"Q5_1": {32, 24}, "Q8_0": {32, 34}, "Q8_1": {32, 36}, "Q2_K": {256, 84}, "Q3_K": {256, 110},
		"Q4_K": {256, 144}, "Q5_K": {256, 176}, "Q6_K": {256, 210}, "Q8_K": {256, 292},
		"IQ2_XXS": {256, 66}, "IQ2_XS": {256, 74}, "IQ3_XXS": {256, 98}, "IQ1_S": {256, 50},
		"IQ4_NL": {32, 18}, "IQ3_S": {256, 110}, "IQ2_S": {256, 82}, "IQ4_XS": {256, 136},
		"I8": {1, 1}, "I16": {1, 2}, "I32": {1, 4}, "I64": {1, 8}, "F64": {1, 8}, "IQ1_M": {256, 56},
		"TQ1_0": {256, 54}, "TQ2_0": {256, 66}, "MXFP4": {32, 17}, "NVFP4": {64, 36}, "Q1_0": {128, 18}, "Q2_0": {64, 18},
	}
	if len(Types()) != len(want) {
		t.Errorf("%d types, want %d", len(Types()), len(want))
	}
	for _, ty := range Types() {
		w, ok := want[ty.String()]
		if !ok {
			t.Errorf("unexpected type %s", ty)
			continue
		}
		if ty.BlockSize() != w[0] || ty.TypeSize() != w[1] {
			t.Errorf("%s: (%d, %d), want %v", ty, ty.BlockSize(), ty.TypeSize(), w)
		}
		if p, ok := ParseType(ty.String()); !ok || p != ty {
			t.Errorf("ParseType(%s) = %v %v", ty, p, ok)
		}
		// Every recorded float field lies inside the block.
		for _, f := range ty.Floats() {
			size := map[FloatKind]int{Half: 2, BFloat16: 2, Float32: 4, Float64: 8}[f.Kind]
			if size == 0 || f.Offset < 0 || int64(f.Offset+size) > ty.TypeSize() {
				t.Errorf("%s: field %s at %d (kind %d) outside the %d-byte block", ty, f.Name, f.Offset, f.Kind, ty.TypeSize())
			}
		}
	}
	for _, removed := range []Type{4, 5, 31, 32, 33, 36, 37, 38, 43} {
		if removed.Known() {
			t.Errorf("type %d should be unknown", removed)
		}
	}
	if p, ok := ParseType("q4_k"); !ok || p != Q4_K {
		t.Errorf("ParseType(q4_k) = %v %v", p, ok)
	}
	if _, ok := ParseType("Q4_\u212a"); ok { // KELVIN SIGN folds to k in Unicode, not here
		t.Error("ParseType accepted a non-ASCII name")
	}
	if n, ok := Q6_K.RowSize(512); !ok || n != 420 {
		t.Errorf("Q6_K row of 512: %d %v", n, ok)
	}
	if _, ok := Q8_0.RowSize(48); ok {
		t.Error("Q8_0 row of 48 accepted")
	}
}

// TestFileType: llama_ftype codes and default types (llamacpp.md §3.3).
func TestFileType(t *testing.T) {
	for _, tt := range []struct {
		f    FileType
		code uint32
		name string
		def  Type
	}{
		{FileF32, 0, "F32", F32}, {FileF16, 1, "F16", F16}, {FileQ8_0, 7, "Q8_0", Q8_0}, {FileQ2_K, 10, "Q2_K", Q2_K},
		{FileQ3_K_M, 12, "Q3_K_M", Q3_K}, {FileQ4_K_M, 15, "Q4_K_M", Q4_K}, {FileQ5_K_M, 17, "Q5_K_M", Q5_K},
		{FileQ6_K, 18, "Q6_K", Q6_K}, {FileQ2_K_S, 21, "Q2_K_S", Q2_K}, {FileBF16, 32, "BF16", BF16},
	} {
		d, ok := tt.f.Default()
		if uint32(tt.f) != tt.code || tt.f.String() != tt.name || !ok || d != tt.def {
			t.Errorf("%d %s default %s %v, want %d %s %s", uint32(tt.f), tt.f, d, ok, tt.code, tt.name, tt.def)
		}
	}
	for typ, want := range map[Type]FileType{F32: 0, F16: 1, BF16: 32, Q8_0: 7, Q4_0: 2, Q5_1: 9} {
		if f, ok := FileTypeOf(typ); !ok || f != want {
			t.Errorf("FileTypeOf(%s) = %d %v, want %d", typ, f, ok, want)
		}
	}
	if f, ok := FileTypeOf(Q4_K); ok {
		t.Errorf("FileTypeOf(Q4_K) = %s: a K-quant file type is a mix", f)
	}
	if FileType(4).Known() || FileType(4).String() != "ftype(4)" {
		t.Error("removed ftype 4 known")
	}
}

// TestQ8_0 checks quantize_row_q8_0_ref on blocks whose answer is exact:
// d = max|x|/127 as a half, q = round half away from zero of x/d.
func TestQ8_0(t *testing.T) {
	blk := func(vals map[int]float32) []float32 {
		x := make([]float32, 32)
		for i, v := range vals {
			x[i] = v
		}
		return x
	}
	for _, tt := range []struct {
		name string
		x    []float32
		d    uint16       // half bits
		q    map[int]int8 // nonzero quants
	}{
		{"zero block", blk(nil), 0, nil},
		// d = 1: x/d rounds half away from zero.
		{"unit scale", blk(map[int]float32{0: 127, 1: 0.5, 2: -0.5, 3: 2.5, 4: -126.5, 5: 1.49}), 0x3C00,
			map[int]int8{0: 127, 1: 1, 2: -1, 3: 3, 4: -127, 5: 1}},
		// The largest magnitude is negative: d = 254/127 = 2.
		{"negative max", blk(map[int]float32{7: -254, 8: 3, 9: -1, 10: 1}), 0x4000,
			map[int]int8{7: -127, 8: 2, 9: -1, 10: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dst := make([]byte, 34)
			if err := Encode(Q8_0, dst, tt.x); err != nil {
				t.Fatal(err)
			}
			if d := binary.LittleEndian.Uint16(dst); d != tt.d {
				t.Errorf("d = %#04x, want %#04x", d, tt.d)
			}
			for i := 0; i < 32; i++ {
				if q := int8(dst[2+i]); q != tt.q[i] {
					t.Errorf("q[%d] = %d, want %d", i, q, tt.q[i])
				}
			}
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	if err := Encode(IQ2_XXS, make([]byte, 66), make([]float32, 256)); !errors.Is(err, ErrNoEncoder) {
		t.Errorf("IQ2_XXS: %v", err)
	}
	if err := Encode(Q8_0, make([]byte, 34), make([]float32, 31)); err == nil {
		t.Error("a partial Q8_0 block encoded")
	}
	if err := Encode(Q8_0, make([]byte, 33), make([]float32, 32)); err == nil {
		t.Error("a short Q8_0 destination accepted")
	}
	if err := Encode(Q4_K, make([]byte, 144), make([]float32, 255)); err == nil {
		t.Error("a partial Q4_K block encoded")
	}
	if err := Encode(Q6_K, make([]byte, 209), make([]float32, 256)); err == nil {
		t.Error("a short Q6_K destination accepted")
	}
	for _, ty := range []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K} {
		if !ty.CanEncode() {
			t.Errorf("%s: no encoder", ty)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	if err := Decode(IQ2_XS, make([]float32, 256), make([]byte, 74)); !errors.Is(err, ErrNoDecoder) {
		t.Errorf("IQ2_XS: %v", err)
	}
	if err := Decode(Q4_K, make([]float32, 255), make([]byte, 144)); err == nil {
		t.Error("a partial Q4_K block decoded")
	}
	if err := Decode(Q4_0, make([]float32, 64), make([]byte, 35)); err == nil {
		t.Error("a short Q4_0 source accepted")
	}
	// Every type ferry writes can be read back (the quality report,
	// re-quantizing a quantized input).
	for _, ty := range Types() {
		if ty.CanEncode() && !ty.CanDecode() {
			t.Errorf("%s: an encoder and no decoder", ty)
		}
	}
	// F32 decodes to itself, bit for bit (NaN payloads too).
	src := []byte{0x01, 0x00, 0xc0, 0x7f, 0x00, 0x00, 0x80, 0xbf}
	got := make([]float32, 2)
	if err := Decode(F32, got, src); err != nil || math.Float32bits(got[0]) != 0x7fc00001 || got[1] != -1 {
		t.Errorf("F32: %#x %v %v", math.Float32bits(got[0]), got[1], err)
	}
}
