package mlxpack

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// The sha256 of quant_vectors_outputs.safetensors as the reference set ships
// it (testdata keeps it gzip'd; see testdata/PROVENANCE.md).
const quantOutputsSHA256 = "9525fb5c76a9d50805d461506d3745719d0e391d86c04282eca944a4e0cb8f27"

// stFile is an in-memory safetensors file.
type stFile struct {
	f    *safetensors.File
	data []byte
}

func (s stFile) bytes(t *testing.T, name string) ([]byte, safetensors.TensorInfo) {
	t.Helper()
	ti, ok := s.f.Tensor(name)
	if !ok {
		t.Fatalf("%s: no tensor %q", s.f.Path, name)
	}
	off := s.f.DataOffset()
	return s.data[off+ti.Begin : off+ti.End], ti
}

func loadST(t *testing.T, path string, gz bool) stFile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if gz {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if raw, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != quantOutputsSHA256 {
			t.Fatalf("%s: the unzipped file's sha256 is %x, the reference's %s", path, sum, quantOutputsSHA256)
		}
	}
	f, err := safetensors.Parse(bytes.NewReader(raw), int64(len(raw)), path)
	if err != nil {
		t.Fatal(err)
	}
	return stFile{f, raw}
}

// quantVector is one mx.quantize case: input key, group size, bits.
type quantVector struct {
	input       string // "<case>.<dtype>"
	group, bits int
}

func (v quantVector) key() string { return fmt.Sprintf("%s.g%d.b%d", v.input, v.group, v.bits) }

func quantVectors(t *testing.T, out stFile) []quantVector {
	var vs []quantVector
	for _, ti := range out.f.Tensors {
		base, ok := strings.CutSuffix(ti.Name, ".wq")
		if !ok {
			continue
		}
		var v quantVector
		i := strings.LastIndex(base, ".g")
		if _, err := fmt.Sscanf(base[i:], ".g%d.b%d", &v.group, &v.bits); err != nil {
			t.Fatalf("vector %q: %v", ti.Name, err)
		}
		v.input = base[:i]
		vs = append(vs, v)
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].key() < vs[j].key() })
	return vs
}

// firstDiff describes where a and b (elements of width bytes) first differ.
func firstDiff(a, b []byte, width int) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d bytes, want %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			e := i / width
			return fmt.Sprintf("element %d: % x, want % x", e, a[e*width:(e+1)*width], b[e*width:(e+1)*width])
		}
	}
	return ""
}

// TestAffineVectors: every mx.quantize vector of MLX 0.32.1's CPU backend
// (2952 tensors: 14 cases × f32/bf16/f16 × group 32/64/128 × bits 2-8)
// comes out identical — wq, scales and biases — and AffineDequantize of the
// reference wq/scales/biases gives mx.dequantize's values exactly.
func TestAffineVectors(t *testing.T) {
	in := loadST(t, "testdata/mlxquant/quant_vectors_inputs.safetensors", false)
	out := loadST(t, "testdata/mlxquant/quant_vectors_outputs.safetensors.gz", true)
	vs := quantVectors(t, out)
	if len(vs)*4 != len(out.f.Tensors) || len(vs) != 738 {
		t.Fatalf("%d vectors for %d tensors, want 738 for 2952", len(vs), len(out.f.Tensors))
	}
	bad := 0
	for _, v := range vs {
		raw, ti := in.bytes(t, v.input)
		dt := ti.DType
		w := make([]float32, ti.NumElements())
		if err := tensor.ToF32(dt, w, raw); err != nil {
			t.Fatal(err)
		}
		cols := int(ti.Shape[len(ti.Shape)-1])
		wantQ, _ := out.bytes(t, v.key()+".wq")
		wantS, _ := out.bytes(t, v.key()+".scales")
		wantB, _ := out.bytes(t, v.key()+".biases")
		wantD, _ := out.bytes(t, v.key()+".deq")
		wq, sc, bi := make([]byte, len(wantQ)), make([]byte, len(wantS)), make([]byte, len(wantB))
		if err := AffineQuantize(w, cols, v.group, v.bits, dt, wq, sc, bi); err != nil {
			t.Fatalf("%s: %v", v.key(), err)
		}
		width := dt.Bits() / 8
		for _, c := range []struct {
			what      string
			got, want []byte
			width     int
		}{{"wq", wq, wantQ, 4}, {"scales", sc, wantS, width}, {"biases", bi, wantB, width}} {
			if d := firstDiff(c.got, c.want, c.width); d != "" {
				bad++
				t.Errorf("%s.%s: %s", v.key(), c.what, d)
			}
		}
		deq := make([]float32, len(w))
		if err := AffineDequantize(wantQ, wantS, wantB, cols, v.group, v.bits, dt, deq); err != nil {
			t.Fatalf("%s: dequantize: %v", v.key(), err)
		}
		gotD := make([]byte, len(wantD))
		if err := tensor.FromF32(dt, gotD, deq); err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(gotD, wantD, width); d != "" {
			bad++
			t.Errorf("%s.deq: %s", v.key(), d)
		}
		if bad > 20 {
			t.Fatal("too many differences")
		}
	}
}

func TestAffineErrors(t *testing.T) {
	w := make([]float32, 128)
	buf := func(n int) []byte { return make([]byte, n) }
	for _, c := range []struct {
		name              string
		w                 []float32
		cols, group, bits int
		dt                tensor.DType
		nq, ns, nb        int
		want              error
		wantText          string
	}{
		{name: "bits 7", w: w, cols: 128, group: 64, bits: 7, dt: tensor.BF16, nq: 112, ns: 4, nb: 4, want: ErrBits},
		{name: "bits 1", w: w, cols: 128, group: 64, bits: 1, dt: tensor.BF16, nq: 16, ns: 4, nb: 4, want: ErrBits},
		{name: "group 16", w: w, cols: 128, group: 16, bits: 4, dt: tensor.BF16, nq: 64, ns: 16, nb: 16, want: ErrGroupSize},
		{name: "group 256", w: w, cols: 128, group: 256, bits: 4, dt: tensor.BF16, nq: 64, ns: 1, nb: 1, want: ErrGroupSize},
		{name: "cols not multiple", w: make([]float32, 96), cols: 96, group: 64, bits: 4, dt: tensor.BF16, nq: 48, ns: 2, nb: 2, want: ErrAffineShape, wantText: "not a multiple of the group size"},
		{name: "partial row", w: make([]float32, 160), cols: 64, group: 64, bits: 4, dt: tensor.BF16, nq: 80, ns: 5, nb: 5, want: ErrAffineShape, wantText: "whole rows"},
		{name: "wq short", w: w, cols: 128, group: 64, bits: 4, dt: tensor.BF16, nq: 60, ns: 4, nb: 4, want: ErrAffineShape},
		{name: "scales short", w: w, cols: 128, group: 64, bits: 4, dt: tensor.F16, nq: 64, ns: 2, nb: 4, want: ErrAffineShape},
		{name: "dtype I8", w: w, cols: 128, group: 64, bits: 4, dt: tensor.I8, nq: 64, ns: 2, nb: 2, wantText: "cannot be stored as I8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := AffineQuantize(c.w, c.cols, c.group, c.bits, c.dt, buf(c.nq), buf(c.ns), buf(c.nb))
			check := func(what string, err error) {
				if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.wantText) {
					t.Errorf("%s: %v, want %v %q", what, err, c.want, c.wantText)
				}
			}
			check("quantize", err)
			check("dequantize", AffineDequantize(buf(c.nq), buf(c.ns), buf(c.nb), c.cols, c.group, c.bits, c.dt, make([]float32, len(c.w))))
		})
	}
	for _, v := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
		x := make([]float32, 128)
		x[77] = v
		err := AffineQuantize(x, 64, 32, 4, tensor.BF16, buf(64), buf(8), buf(8))
		if !errors.Is(err, ErrNotFinite) || !strings.Contains(err.Error(), "element 77 (row 1, column 13)") {
			t.Errorf("%v: %v", v, err)
		}
	}
}

// ulpOf is the spacing of dt's values at |x| (its smallest subnormal at 0).
func ulpOf(dt tensor.DType, x float64) float64 {
	p, minExp := 23, -149 // mantissa bits, exponent of the smallest subnormal
	switch dt {
	case tensor.BF16:
		p, minExp = 7, -133
	case tensor.F16:
		p, minExp = 10, -24
	}
	_, e := math.Frexp(math.Abs(x)) // |x| = m·2^e, m in [0.5, 1)
	return math.Ldexp(1, max(e-1-p, minExp))
}

// boundCases are adversarial and random rows of 256 columns (two rows
// each), as float64; the test rounds them to the dtype under test.
func boundCases(dt tensor.DType) map[string][]float64 {
	rng := rand.New(rand.NewPCG(16, 1))
	const n = 512
	gen := func(f func(i int) float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = f(i)
		}
		return v
	}
	huge := 1e30
	sub := 1e-40 // below float32's and bfloat16's smallest normal (1.2e-38)
	if dt == tensor.F16 {
		huge, sub = 6e4, 3e-6 // float16: largest finite 65504, smallest normal 6.1e-5
	}
	return map[string][]float64{
		"normal":        gen(func(int) float64 { return rng.NormFloat64() * 0.02 }),
		"uniform mixed": gen(func(int) float64 { return rng.Float64()*4 - 1 }),
		"all negative":  gen(func(int) float64 { return -0.01 - 3*rng.Float64() }),
		"all zero":      gen(func(int) float64 { return 0 }),
		"constant":      gen(func(i int) float64 { return []float64{0.37, -2.5, 1e-3, 7}[i/128] }),
		"huge range": gen(func(i int) float64 {
			if i%37 == 0 {
				return huge * float64(1-2*(i/37%2))
			}
			return rng.NormFloat64() * 1e-3
		}),
		"subnormal": gen(func(i int) float64 { return rng.NormFloat64() * sub }),
		"subnormal and zero": gen(func(i int) float64 {
			if i%3 == 0 {
				return 0
			}
			return rng.NormFloat64() * sub
		}),
		"sparse": gen(func(i int) float64 {
			if i%29 == 0 {
				return rng.NormFloat64()
			}
			return 0
		}),
		"ties": gen(func(i int) float64 { return float64(i%32)*0.5 - 4 }),
	}
}

// TestAffineRoundTrip checks what the algorithm guarantees, for every bits ×
// group size × stored dtype on random and adversarial groups, against
// exact (float64) arithmetic rather than a second implementation:
//
//   - the codes do not depend on the stored dtype (they are computed with the
//     float32 scale s and bias b, before those are rounded);
//   - b is 0 or the group's minimum or maximum, s is negative unless
//     |min| > |max|, and b/s is an integer: the grid has an exact zero;
//   - each code is the nearest grid point, clamped to [0, 2^bits−1]; the
//     clamp (from the zero-exact rescale) never exceeds one step;
//   - an exact zero gets the grid's zero code −b/s;
//   - |dequantize(quantize(w)) − w| ≤ |s|·(1/2 + clamp) + the rounding of s
//     and b to the stored dtype and of dequantization's product and sum;
//     for an unclamped element stored as F32 that is |s|/2 plus float32
//     rounding.
//
// Exact zeros keep the zero code but need not dequantize to exactly 0:
// q·s+b rounds, and mx.dequantize itself gives ±1 ulp for 721 of the
// 59238 zeros of the reference vectors (including 144 of F32 inputs).
func TestAffineRoundTrip(t *testing.T) {
	const cols = 256
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		cases := boundCases(dt)
		names := make([]string, 0, len(cases))
		for k := range cases {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, name := range names {
			w := make([]float32, len(cases[name]))
			for i, v := range cases[name] {
				w[i] = tensor.RoundTo(dt, float32(v))
			}
			for _, group := range AffineGroupSizes {
				for _, bits := range AffineBits {
					what := fmt.Sprintf("%s %s g%d b%d", dt, name, group, bits)
					checkRoundTrip(t, what, w, cols, group, bits, dt)
				}
			}
		}
	}
}

func checkRoundTrip(t *testing.T, what string, w []float32, cols, group, bits int, dt tensor.DType) {
	t.Helper()
	groups, width := len(w)/group, dt.Bits()/8
	nq := len(w) * bits / 8
	q32, s32, b32 := make([]byte, nq), make([]byte, groups*4), make([]byte, groups*4)
	if err := AffineQuantize(w, cols, group, bits, tensor.F32, q32, s32, b32); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	wq, sc, bi := make([]byte, nq), make([]byte, groups*width), make([]byte, groups*width)
	if err := AffineQuantize(w, cols, group, bits, dt, wq, sc, bi); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(wq, q32) {
		t.Fatalf("%s: the codes depend on the stored dtype", what)
	}
	deq := make([]float32, len(w))
	if err := AffineDequantize(wq, sc, bi, cols, group, bits, dt, deq); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	codes := make([]float64, len(w)) // unpacked independently: bit i·bits of the row onward
	for i := range codes {
		for k := range bits {
			pos := i*bits + k
			codes[i] += float64(wq[pos/8] >> (pos % 8) & 1 * (1 << k))
		}
	}
	nBins := float64(int(1)<<bits - 1)
	for g := range groups {
		x := w[g*group : (g+1)*group]
		lo, hi := float64(slices.Min(x)), float64(slices.Max(x))
		s, b := float64(getScale(s32[g*4:], tensor.F32)), float64(getScale(b32[g*4:], tensor.F32))
		sst, bst := float64(getScale(sc[g*width:], dt)), float64(getScale(bi[g*width:], dt))
		if b != 0 && b != lo && b != hi {
			t.Fatalf("%s group %d: bias %g is neither 0 nor the minimum %g or maximum %g", what, g, b, lo, hi)
		}
		if (s < 0) == (math.Abs(lo) > math.Abs(hi)) {
			t.Fatalf("%s group %d: scale %g for minimum %g, maximum %g", what, g, s, lo, hi)
		}
		zero := -b / s // the grid position of 0.0 (outside the grid when the group has no zero)
		if math.Abs(zero-math.Round(zero)) > 1e-4+math.Abs(zero)*0x1p-22 {
			t.Fatalf("%s group %d: 0 is at code %g (scale %g, bias %g), not a code of the grid", what, g, zero, s, b)
		}
		for j, v := range x {
			i := g*group + j
			q := codes[i]
			u := (float64(v) - b) / s // exact position on the grid
			clamp := max(u-nBins, -u, 0)
			if clamp > 1 {
				t.Fatalf("%s element %d: %g is %g steps beyond the grid", what, i, v, clamp)
			}
			slack := math.Abs(u)*0x1p-21 + 1e-9 // float32 w−b and division
			if math.Abs(q-min(max(u, 0), nBins)) > 0.5+slack {
				t.Fatalf("%s element %d: %g at grid position %g got code %g", what, i, v, u, q)
			}
			if v == 0 && q != math.Round(zero) {
				t.Fatalf("%s element %d: 0 got code %g, the grid's zero is %g", what, i, q, zero)
			}
			if dt == tensor.F16 && math.Abs(q*sst) > 65504 {
				// MLX multiplies in float16: the product overflows to ±Inf
				// even where the sum would fit, as in mx.dequantize's
				// huge_range.f16 reference vectors.
				if !math.IsInf(float64(deq[i]), 0) {
					t.Fatalf("%s element %d: code %g × scale %g overflows float16, but dequantized to %g", what, i, q, sst, deq[i])
				}
				continue
			}
			bound := math.Abs(s)*(0.5+clamp+slack) + q*math.Abs(sst-s) + math.Abs(bst-b) +
				ulpOf(dt, q*sst)/2 + ulpOf(dt, math.Abs(q*sst)+math.Abs(bst))
			if err := math.Abs(float64(deq[i]) - float64(v)); err > bound {
				t.Fatalf("%s element %d: %g dequantizes to %g (code %g, scale %g→%g, bias %g→%g): error %g > bound %g",
					what, i, v, deq[i], q, s, sst, b, bst, err, bound)
			}
		}
	}
}
