package verify

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"runtime"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

func TestScanFloats(t *testing.T) {
	f32 := func(v ...float32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b
	}
	f16 := func(h ...uint16) []byte {
		b := make([]byte, 2*len(h))
		for i, x := range h {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return b
	}
	inf := float32(math.Inf(1))
	cases := []struct {
		name    string
		dt      tensor.DType
		data    []byte
		badUnit int64
		nonzero bool
	}{
		{"f32 fine", tensor.F32, f32(0, 1, -2), -1, true},
		{"f32 all zero incl. -0", tensor.F32, f32(0, float32(math.Copysign(0, -1))), -1, false},
		{"f32 +Inf at 2", tensor.F32, f32(1, 2, inf, 3), 2, true},
		{"f32 NaN at 0", tensor.F32, f32(float32(math.NaN()), 1), 0, true},
		{"f16 fine, subnormal counts as nonzero", tensor.F16, f16(0x0001, 0), -1, true},
		{"f16 -Inf at 1", tensor.F16, f16(0x3C00, 0xFC00), 1, true},
		{"f16 all zero", tensor.F16, f16(0, 0x8000), -1, false},
		{"bf16 NaN at 1", tensor.BF16, f16(0x3F80, 0x7FC1), 1, true},
		{"bf16 max finite", tensor.BF16, f16(0x7F7F), -1, true},
		{"f8e4m3 NaN is S.1111.111", tensor.F8_E4M3, []byte{0x7E, 0xFF}, 1, true},
		{"f8e5m2 Inf", tensor.F8_E5M2, []byte{0x00, 0x7C}, 1, true},
		{"f8e5m2 zeros", tensor.F8_E5M2, []byte{0x00, 0x80}, -1, false},
		{"f64 fine", tensor.F64, binary.LittleEndian.AppendUint64(nil, math.Float64bits(1.5)), -1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := scan(bytes.NewReader(c.data), int64(len(c.data)), floatLayouts[c.dt])
			if err != nil {
				t.Fatal(err)
			}
			if res.badUnit != c.badUnit || res.nonzero != c.nonzero || res.bytes != int64(len(c.data)) {
				t.Errorf("bad unit %d nonzero %v bytes %d, want %d %v %d", res.badUnit, res.nonzero, res.bytes, c.badUnit, c.nonzero, len(c.data))
			}
		})
	}
}

// TestScanChunks: a tensor larger than the 1 MiB read buffer, with its
// only NaN and only nonzero value past the first chunk, and a block type
// whose unit does not divide 1 MiB.
func TestScanChunks(t *testing.T) {
	n := 3<<20 + 6
	b := make([]byte, n) // F16 zeros
	binary.LittleEndian.PutUint16(b[n-4:], 0x3C00)
	binary.LittleEndian.PutUint16(b[(2<<20)+2:], 0x7E00)
	res, err := scan(bytes.NewReader(b), int64(n), floatLayouts[tensor.F16])
	if err != nil {
		t.Fatal(err)
	}
	if res.badUnit != (2<<20+2)/2 || !res.nonzero || res.units != int64(n/2) {
		t.Fatalf("%+v", res)
	}
	// Q6_K: 210-byte super-blocks, d at 208; block 6000 (past 1 MiB) has
	// the only nonzero d, block 7000 a NaN d.
	q6k, _ := ggmlLayout(quant.Q6_K)
	q := make([]byte, 210*8000)
	binary.LittleEndian.PutUint16(q[210*6000+208:], 0x3000)
	binary.LittleEndian.PutUint16(q[210*7000+208:], 0x7C01)
	res, err = scan(bytes.NewReader(q), int64(len(q)), q6k)
	if err != nil {
		t.Fatal(err)
	}
	if res.badUnit != 7000 || !res.nonzero || res.units != 8000 {
		t.Fatalf("%+v", res)
	}
	text, problem := res.text("scale", 210, 100)
	if problem == "" || text != "non-finite scale at byte offset 1470100" {
		t.Errorf("%q / %q", text, problem)
	}
	// A size that is not whole units is an error, not a silent pass.
	if _, err := scan(bytes.NewReader(q[:100]), 100, q6k); err == nil {
		t.Error("partial block accepted")
	}
	// A short reader is an error.
	if _, err := scan(bytes.NewReader(q[:210]), 420, q6k); err == nil {
		t.Error("short read accepted")
	}
}

// TestScanSmallTensorBuffer: a tensor smaller than the 1 MiB read buffer
// is read through a buffer of its own size. With a 1 MiB buffer allocated
// and cleared per tensor, --deep of FuzzConfig's 0.7 MB checkpoint of many
// small tensors took 38 ms of CPU, 3 ms with the buffer sized to the tensor.
func TestScanSmallTensorBuffer(t *testing.T) {
	b := make([]byte, 4096) // 2048 F16 values
	binary.LittleEndian.PutUint16(b, 0x3C00)
	var before, after runtime.MemStats
	const runs = 20
	runtime.ReadMemStats(&before)
	for range runs {
		if res, err := scan(bytes.NewReader(b), int64(len(b)), floatLayouts[tensor.F16]); err != nil || !res.nonzero {
			t.Fatalf("%+v, %v", res, err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 2*uint64(len(b)) {
		t.Errorf("scan of a %d-byte tensor allocated %d bytes, want at most %d", len(b), per, 2*len(b))
	}
}

// TestGGMLLayouts pins the scan layout --deep builds from gguf/quant's
// block traits to ggml-common.h's structs (llamacpp.md §1.7): unit =
// bytes per block, the f16/f32 fields at their offsets, for Q8_0 the
// quants that must not all be zero, and what --deep says it checked.
func TestGGMLLayouts(t *testing.T) {
	const (
		plain = "every value finite, not all zero"
		dOnly = "every block's d finite, not all zero"
		dm    = "every block's d and m finite, not all zero"
		kD    = "every super-block's d finite, not all zero"
		kDmin = "every super-block's d and dmin finite, not all zero"
	)
	for typ, want := range map[quant.Type]layout{
		quant.F32:  {4, []field{{0, 'f'}}, [2]int{}, plain},
		quant.F64:  {8, []field{{0, 'd'}}, [2]int{}, plain},
		quant.F16:  {2, []field{{0, 'h'}}, [2]int{}, plain},
		quant.BF16: {2, []field{{0, 'b'}}, [2]int{}, plain},
		quant.Q8_0: {34, []field{{0, 'h'}}, [2]int{2, 34}, "every block's scale d finite; some value nonzero"},
		quant.Q4_0: {18, []field{{0, 'h'}}, [2]int{}, dOnly},
		quant.Q4_1: {20, []field{{0, 'h'}, {2, 'h'}}, [2]int{}, dm},
		quant.Q5_0: {22, []field{{0, 'h'}}, [2]int{}, dOnly},
		quant.Q5_1: {24, []field{{0, 'h'}, {2, 'h'}}, [2]int{}, dm},
		quant.Q2_K: {84, []field{{80, 'h'}, {82, 'h'}}, [2]int{}, kDmin},
		quant.Q3_K: {110, []field{{108, 'h'}}, [2]int{}, kD},
		quant.Q4_K: {144, []field{{0, 'h'}, {2, 'h'}}, [2]int{}, kDmin},
		quant.Q5_K: {176, []field{{0, 'h'}, {2, 'h'}}, [2]int{}, kDmin},
		quant.Q6_K: {210, []field{{208, 'h'}}, [2]int{}, kD},
	} {
		got, ok := ggmlLayout(typ)
		if !ok {
			t.Errorf("%s: not decoded", typ)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: layout %+v, want %+v", typ, got, want)
		}
	}
	// Types --deep does not decode fall back to the byte check.
	for _, typ := range []quant.Type{quant.Q8_1, quant.Q8_K, quant.IQ4_XS, quant.I32, quant.MXFP4} {
		if _, ok := ggmlLayout(typ); ok {
			t.Errorf("%s: decoded", typ)
		}
	}
}

// TestFloatType: the types a norm may be stored in are the plain float
// types, as gguf/quant's table says.
func TestFloatType(t *testing.T) {
	for typ, want := range map[quant.Type]bool{
		quant.F32: true, quant.F16: true, quant.BF16: true, quant.F64: true,
		quant.I32: false, quant.I8: false, quant.Q8_0: false, quant.Q4_K: false, quant.Type(99): false,
	} {
		if got := floatType(typ); got != want {
			t.Errorf("floatType(%s) = %v, want %v", typ, got, want)
		}
	}
}
