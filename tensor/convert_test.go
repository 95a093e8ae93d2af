package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func f32(bits uint32) float32 { return math.Float32frombits(bits) }

func TestFloat32ToBF16(t *testing.T) {
	tests := []struct {
		name string
		in   uint32 // float32 bits
		want uint16
	}{
		{"one", 0x3f800000, 0x3f80},
		{"+0", 0x00000000, 0x0000},
		{"-0", 0x80000000, 0x8000},
		{"+Inf", 0x7f800000, 0x7f80},
		{"-Inf", 0xff800000, 0xff80},
		{"exact", 0x40490000, 0x4049},
		{"below half rounds down", 0x3f807fff, 0x3f80},
		{"above half rounds up", 0x3f808001, 0x3f81},
		{"tie to even stays (even low bit)", 0x3f808000, 0x3f80},
		{"tie to even goes up (odd low bit)", 0x3f818000, 0x3f82},
		{"negative tie stays", 0xbf808000, 0xbf80},
		{"negative tie goes up in magnitude", 0xbf818000, 0xbf82},
		{"carry into exponent", 0x3fffffff, 0x4000},
		{"max finite float32 overflows to Inf", 0x7f7fffff, 0x7f80},
		{"largest value that stays finite", 0x7f7f7fff, 0x7f7f},
		{"tie at max finite bf16 rounds to Inf", 0x7f7f8000, 0x7f80},
		{"-max overflows to -Inf", 0xff7fffff, 0xff80},
		{"float32 subnormal kept", 0x00010000, 0x0001},
		{"smallest float32 subnormal to 0", 0x00000001, 0x0000},
		{"subnormal tie to even", 0x00008000, 0x0000},
		{"subnormal above half", 0x00008001, 0x0001},
		{"subnormal rounds into normal", 0x007fffff, 0x0080},
		{"quiet NaN", 0x7fc00000, 0x7fc0},
		{"signalling NaN stays NaN", 0x7f800001, 0x7fc0},
		{"NaN whose rounding would make Inf", 0x7f807fff, 0x7fc0},
		{"negative NaN", 0xffc00001, 0x7fc0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Float32ToBF16(f32(tt.in)); got != tt.want {
				t.Errorf("Float32ToBF16(%#08x) = %#04x, want %#04x", tt.in, got, tt.want)
			}
			var dst [2]byte
			F32ToBF16(dst[:], []float32{f32(tt.in)})
			if got := binary.LittleEndian.Uint16(dst[:]); got != tt.want {
				t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", tt.in, got, tt.want)
			}
		})
	}
}

func TestFloat32ToF16(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"+0", 0, 0x0000},
		{"-0", f32(0x80000000), 0x8000},
		{"+Inf", float32(math.Inf(1)), 0x7c00},
		{"-Inf", float32(math.Inf(-1)), 0xfc00},
		{"max finite 65504", 65504, 0x7bff},
		{"65519 rounds down to max", 65519, 0x7bff},
		{"65520 ties to Inf", 65520, 0x7c00},
		{"-65520 ties to -Inf", -65520, 0xfc00},
		{"1e5 overflows", 1e5, 0x7c00},
		{"max float32 overflows", math.MaxFloat32, 0x7c00},
		// 1 + 2^-11 is half an ulp above 1: tie, 1 is even.
		{"tie to even stays", 1 + 1.0/2048, 0x3c00},
		// 1 + 3·2^-11 is half an ulp above 1+2^-10 (odd): goes up.
		{"tie to even goes up", 1 + 3.0/2048, 0x3c02},
		{"just above tie", f32(math.Float32bits(1+1.0/2048) + 1), 0x3c01},
		{"just below tie", f32(math.Float32bits(1+3.0/2048) - 1), 0x3c01},
		{"negative tie goes up in magnitude", -(1 + 3.0/2048), 0xbc02},
		{"smallest normal 2^-14", 1.0 / 16384, 0x0400},
		{"largest subnormal", 1023.0 / (1 << 24), 0x03ff},
		{"subnormal rounds up into normal", (1023.5 + 0.25) / (1 << 24), 0x0400},
		{"subnormal tie into normal (1023 odd)", 1023.5 / (1 << 24), 0x0400},
		{"smallest subnormal 2^-24", 1.0 / (1 << 24), 0x0001},
		{"-smallest subnormal", -1.0 / (1 << 24), 0x8001},
		{"half smallest subnormal ties to 0", 0.5 / (1 << 24), 0x0000},
		{"-half smallest subnormal ties to -0", -0.5 / (1 << 24), 0x8000},
		{"just above half smallest subnormal", f32(math.Float32bits(0.5/(1<<24)) + 1), 0x0001},
		{"1.5 smallest subnormal ties up to 2", 1.5 / (1 << 24), 0x0002},
		{"2.5 smallest subnormal ties down to 2", 2.5 / (1 << 24), 0x0002},
		{"subnormal exact", 3.0 / (1 << 24), 0x0003},
		{"far below subnormal", 1e-30, 0x0000},
		{"float32 subnormal", f32(0x00000001), 0x0000},
		{"quiet NaN", float32(math.NaN()), 0x7e00},
		{"negative NaN keeps sign", f32(0xffc00000), 0xfe00},
		{"signalling NaN stays NaN", f32(0x7f800001), 0x7e00},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Float32ToF16(tt.in); got != tt.want {
				t.Errorf("Float32ToF16(%g) = %#04x, want %#04x", tt.in, got, tt.want)
			}
			var dst [2]byte
			F32ToF16(dst[:], []float32{tt.in})
			if got := binary.LittleEndian.Uint16(dst[:]); got != tt.want {
				t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tt.in, got, tt.want)
			}
		})
	}
}

func TestF16ToFloat32(t *testing.T) {
	tests := []struct {
		in   uint16
		want float32
	}{
		{0x3c00, 1},
		{0x0000, 0},
		{0x7bff, 65504},
		{0xfbff, -65504},
		{0x0400, 1.0 / 16384},
		{0x0001, 1.0 / (1 << 24)},
		{0x8001, -1.0 / (1 << 24)},
		{0x03ff, 1023.0 / (1 << 24)},
		{0x0200, 512.0 / (1 << 24)},
		{0x7c00, float32(math.Inf(1))},
		{0xfc00, float32(math.Inf(-1))},
		{0x3555, 0.333251953125},
	}
	for _, tt := range tests {
		if got := F16ToFloat32(tt.in); got != tt.want {
			t.Errorf("F16ToFloat32(%#04x) = %g, want %g", tt.in, got, tt.want)
		}
	}
	if got := F16ToFloat32(0x8000); got != 0 || !math.Signbit(float64(got)) {
		t.Errorf("F16ToFloat32(0x8000) = %g, want -0", got)
	}
	for _, h := range []uint16{0x7c01, 0x7e00, 0xfe00, 0x7fff} {
		if got := F16ToFloat32(h); !math.IsNaN(float64(got)) {
			t.Errorf("F16ToFloat32(%#04x) = %g, want NaN", h, got)
		}
	}
	if got := BF16ToFloat32(0xff80); !math.IsInf(float64(got), -1) {
		t.Errorf("BF16ToFloat32(0xff80) = %g, want -Inf", got)
	}
	if got := BF16ToFloat32(0x7fc1); !math.IsNaN(float64(got)) {
		t.Errorf("BF16ToFloat32(0x7fc1) = %g, want NaN", got)
	}
}

// Every non-NaN 16-bit pattern survives widening and narrowing unchanged;
// every NaN pattern stays NaN.
func TestRoundTripExhaustive(t *testing.T) {
	src := make([]byte, 2*65536)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	wide := make([]float32, 65536)
	back := make([]byte, len(src))
	for _, k := range []struct {
		name   string
		isNaN  func(uint16) bool
		widen  func([]float32, []byte)
		narrow func([]byte, []float32)
		scalar func(float32) uint16
	}{
		{"F16", func(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }, F16ToF32, F32ToF16, Float32ToF16},
		{"BF16", func(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x7f != 0 }, BF16ToF32, F32ToBF16, Float32ToBF16},
	} {
		k.widen(wide, src)
		k.narrow(back, wide)
		n := 0
		for i := range 65536 {
			h := uint16(i)
			got := binary.LittleEndian.Uint16(back[2*i:])
			if k.isNaN(h) {
				if !math.IsNaN(float64(wide[i])) || !k.isNaN(got) {
					t.Errorf("%s %#04x: NaN became %g → %#04x", k.name, h, wide[i], got)
				}
				continue
			}
			n++
			if got != h {
				t.Errorf("%s %#04x → %g → %#04x", k.name, h, wide[i], got)
			}
			if s := k.scalar(wide[i]); s != h {
				t.Errorf("%s scalar %#04x → %g → %#04x", k.name, h, wide[i], s)
			}
		}
		if n < 63000 {
			t.Fatalf("%s: only %d non-NaN patterns checked", k.name, n)
		}
	}
}

// refF16 rounds x to binary16 using float64 arithmetic only: find the
// nearest representable values and pick by distance, ties to even.
func refF16(x float32) uint16 {
	v := float64(x)
	var sign uint16
	if math.Signbit(v) {
		sign = 0x8000
		v = -v
	}
	switch {
	case math.IsNaN(v):
		panic("NaN")
	case v >= 65520: // half an ulp above 65504
		return sign | 0x7c00
	}
	// Quantum: 2^-24 for subnormals and [2^-14, 2^-13), 2^(e-10) above.
	q := math.Ldexp(1, -24)
	if v >= math.Ldexp(1, -14) {
		_, e := math.Frexp(v) // v = f·2^e, f in [0.5, 1)
		q = math.Ldexp(1, e-1-10)
	}
	n := math.Floor(v / q)
	r := v - n*q
	switch {
	case r > q/2:
		n++
	case r == q/2 && math.Mod(n, 2) == 1:
		n++
	}
	v = n * q
	if v >= 65520 {
		return sign | 0x7c00
	}
	if v < math.Ldexp(1, -14) {
		return sign | uint16(n) // subnormal: n quanta of 2^-24
	}
	frac, e := math.Frexp(v)
	return sign | uint16(e-1+15)<<10 | uint16((frac*2-1)*1024)
}

func TestF32ToF16MatchesFloat64Reference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1 << 20
	src := make([]float32, 0, n)
	for len(src) < n {
		var f float32
		switch len(src) % 4 {
		case 0: // any bit pattern
			f = f32(rng.Uint32())
		case 1: // the F16 range, all exponents
			f = f32(rng.Uint32N(0x47800000-0x33000000) + 0x33000000)
		case 2: // values typical of weights
			f = float32(rng.NormFloat64() * 0.02)
		default: // exact ties: an F16 value plus half its ulp
			h := uint16(rng.Uint32N(0x7bff))
			lo := float64(F16ToFloat32(h))
			hi := float64(F16ToFloat32(h + 1))
			f = float32((lo + hi) / 2)
		}
		if f != f { // NaN handled by the table tests
			continue
		}
		src = append(src, f)
	}
	dst := make([]byte, 2*n)
	F32ToF16(dst, src)
	for i, f := range src {
		want := refF16(f)
		if got := binary.LittleEndian.Uint16(dst[2*i:]); got != want {
			t.Fatalf("F32ToF16(%g = %#08x) = %#04x, float64 reference %#04x", f, math.Float32bits(f), got, want)
		}
		if got := Float32ToF16(f); got != want {
			t.Fatalf("Float32ToF16(%g = %#08x) = %#04x, float64 reference %#04x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestF32ToBF16MatchesFloat64Reference(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1 << 20 {
		f := f32(rng.Uint32())
		if f != f {
			continue
		}
		got := Float32ToBF16(f)
		// Neighbours by truncation; pick the nearer in float64, ties to even.
		b := math.Float32bits(f)
		lo := uint16(b >> 16)
		hi := lo + 1
		dlo := math.Abs(float64(f) - float64(BF16ToFloat32(lo)))
		dhi := math.Abs(float64(BF16ToFloat32(hi)) - float64(f))
		if hi&0x7f80 == 0x7f80 && lo&0x7fff == 0x7f7f { // next is Inf: measure to 2^128
			dhi = math.Abs(math.Ldexp(1, 128) - math.Abs(float64(f)))
		}
		want := lo
		if dhi < dlo || (dhi == dlo && lo&1 == 1) {
			want = hi
		}
		if got != want {
			t.Fatalf("Float32ToBF16(%g = %#08x) = %#04x, want %#04x", f, b, got, want)
		}
	}
}

func TestToF32FromF32(t *testing.T) {
	vals := []float32{0, 1, -2.5, 256, 1.0 / 16384}
	for _, d := range []DType{BF16, F16, F32, F64} {
		buf := make([]byte, len(vals)*d.Bits()/8)
		if err := FromF32(d, buf, vals); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(vals))
		if err := ToF32(d, got, buf); err != nil {
			t.Fatal(err)
		}
		for i := range vals {
			if got[i] != vals[i] {
				t.Errorf("%s: %g → %g", d, vals[i], got[i])
			}
		}
	}
	if err := ToF32(I32, nil, nil); err == nil {
		t.Error("ToF32(I32) succeeded")
	}
	if err := FromF32(U8, nil, nil); err == nil {
		t.Error("FromF32(U8) succeeded")
	}
}

func TestLengthMismatchPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for a 3-byte buffer and 2 elements")
		}
	}()
	BF16ToF32(make([]float32, 2), make([]byte, 3))
}

const benchElems = 1 << 20 // 4 MiB of float32, fits in L2/L3 like a worker's chunk

func benchInput() []float32 {
	rng := rand.New(rand.NewPCG(5, 6))
	src := make([]float32, benchElems)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 0.02)
	}
	return src
}

// SetBytes counts the input buffer only (2 bytes per element when widening,
// 4 when narrowing), so MB/s is input consumed per second.

func BenchmarkBF16ToF32(b *testing.B) {
	src := make([]byte, 2*benchElems)
	F32ToBF16(src, benchInput())
	dst := make([]float32, benchElems)
	b.SetBytes(2 * benchElems)
	for b.Loop() {
		BF16ToF32(dst, src)
	}
}

func BenchmarkF32ToBF16(b *testing.B) {
	src := benchInput()
	dst := make([]byte, 2*benchElems)
	b.SetBytes(4 * benchElems)
	for b.Loop() {
		F32ToBF16(dst, src)
	}
}

func BenchmarkF16ToF32(b *testing.B) {
	src := make([]byte, 2*benchElems)
	F32ToF16(src, benchInput())
	dst := make([]float32, benchElems)
	b.SetBytes(2 * benchElems)
	for b.Loop() {
		F16ToF32(dst, src)
	}
}

func BenchmarkF32ToF16(b *testing.B) {
	src := benchInput()
	dst := make([]byte, 2*benchElems)
	b.SetBytes(4 * benchElems)
	for b.Loop() {
		F32ToF16(dst, src)
	}
}
