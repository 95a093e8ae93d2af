package convert

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"math"
	"math/big"
	"sort"
	"sync"

	"github.com/ferry-llm/ferry/tensor"
)

// convert_hf_to_gguf.py computes ssm_a = -torch.exp(A_log) on the CPU, in
// the checkpoint's dtype when that is F16 or F32 and in F32 otherwise
// (prepare_tensors widens BF16 first). torch evaluates exp two different
// ways, and neither is correctly rounded, so float32(math.Exp(float64(x)))
// misses the converter on 225 of the 65,536 bf16 inputs
// (testdata/torch/PROVENANCE.md):
//
//   - a float32 tensor goes to MKL's vector math (vmsExp, high accuracy);
//     its result depends on the instruction set MKL picks: this is the
//     AVX-512 one, what the reference converter ran (AVX2 and SSE4.2 give
//     other values for 319 and 248 of the bf16 inputs);
//   - a float16 (or bfloat16) tensor is widened and goes to ATen's
//     Vectorized<float>::exp, SLEEF's expf_u10, then is rounded back.
//
// Both are done here step by step in the same float32 operations; fma32 is
// one fused multiply-add.

// torchExpF32 is torch.exp of a float32 tensor on an AVX-512 x86-64 CPU.
// The kernel (the algorithm of Intel's published SVML AVX-512
// __svml_expf16_ha, which MKL's vmsExp follows with one coefficient one
// ulp apart) is:
//
//   - N = x·log2(e) + 1.5·2^18 rounded toward zero, minus the shifter:
//     x/ln2 truncated to 5 fractional bits, j its fraction in 32nds;
//   - R = x − N·ln2 in two fused steps (ln2 as a float32 head and tail);
//   - p = R + Tlr[j] + R²·(c2 + c3·R), Th[j]·(1+Tlr[j]) = 2^(j/32);
//   - result = T + T·p (fused) with T = Th[j]·2^⌊N⌋.
//
// From |x| ≥ 87.33654 on (overflow, underflow, subnormal results) the
// kernel hands the element to a float64 routine that rounds once to
// float32; math.Exp rounded to float32 gives the same results there. NaN
// comes back quieted with its payload.
//
// The kernel alone (torchExpKernel) is torch's value on every bf16 input
// and every float16 one, and on all but 16,053 of the 2^32 float32 inputs,
// where it is one ulp off: MKL's kernel differs in a detail not found yet,
// most visibly for x in (−2^-9, −2^-18]. Those inputs and torch's values
// there, measured with the real torch on the whole float32 range
// (testdata/torch/PROVENANCE.md), are torchexp_fixups.u32le; with them
// torchExpF32 is torch's function on every float32 input.
func torchExpF32(x float32) float32 {
	if y, ok := torchExpFixups().lookup(math.Float32bits(x)); ok {
		return math.Float32frombits(y)
	}
	return torchExpKernel(x)
}

// torchexp_fixups.u32le: little-endian pairs (input bits, torch's output
// bits), ascending by input, of the float32 inputs where torchExpKernel is
// one ulp away from torch.exp. 128 KiB; a lookup costs one bit test for
// the inputs outside the 2,775 high halves that hold one.
//
//go:embed torchexp_fixups.u32le
var torchExpFixupData []byte

type expFixups struct {
	in, out []uint32
	hi      [1 << 16 / 64]uint64 // bit k: some input has high half k
}

var torchExpFixups = sync.OnceValue(func() *expFixups {
	f, err := parseExpFixups(torchExpFixupData)
	if err != nil {
		panic("gguf/convert: torchexp_fixups.u32le: " + err.Error())
	}
	return f
})

func parseExpFixups(b []byte) (*expFixups, error) {
	if len(b)%8 != 0 {
		return nil, errors.New("length is not a multiple of 8")
	}
	n := len(b) / 8
	f := &expFixups{in: make([]uint32, n), out: make([]uint32, n)}
	for i := range n {
		f.in[i] = binary.LittleEndian.Uint32(b[8*i:])
		f.out[i] = binary.LittleEndian.Uint32(b[8*i+4:])
		if i > 0 && f.in[i] <= f.in[i-1] {
			return nil, errors.New("inputs not strictly ascending")
		}
		h := f.in[i] >> 16
		f.hi[h/64] |= 1 << (h % 64)
	}
	return f, nil
}

func (f *expFixups) lookup(x uint32) (uint32, bool) {
	if h := x >> 16; f.hi[h/64]&(1<<(h%64)) == 0 {
		return 0, false
	}
	i := sort.Search(len(f.in), func(i int) bool { return f.in[i] >= x })
	if i < len(f.in) && f.in[i] == x {
		return f.out[i], true
	}
	return 0, false
}

// torchExpKernel is the AVX-512 kernel described above, without the
// measured corrections.
func torchExpKernel(x float32) float32 {
	if x != x {
		return math.Float32frombits(math.Float32bits(x) | 1<<22)
	}
	if math.Float32bits(x)&0x7fffffff >= 0x42aeac4f { // 87.33654
		return float32(math.Exp(float64(x)))
	}
	const (
		log2e   = 1.44269502162933349609375                      // 0x3fb8aa3b
		shifter = 393216                                         // 1.5·2^18: 5 fractional bits
		ln2Hi   = 0.693147182464599609375                        // 0x3f317218, float32(ln2)
		ln2Lo   = -1.904654212125933554489165544509887695312e-09 // 0xb102e308, ln2 − ln2Hi
		c3      = 0.16666774451732635498046875                   // 0x3e2aaaf3
		c2      = 0.500014722347259521484375                     // 0x3f0000f7
	)
	sh := fma32RZ(x, log2e, shifter)
	n := sh - shifter
	j := math.Float32bits(sh) & 31
	r := fma32(-n, ln2Hi, x)
	r = fma32(-n, ln2Lo, r)
	t := float32(math.Ldexp(float64(expTab.th[j]), int(math.Floor(float64(n)))))
	p := fma32(fma32(r, c3, c2), float32(r*r), r+expTab.tlr[j])
	return fma32(t, p, t)
}

// expTab holds Th[j], 2^(j/32) rounded to float32, and Tlr[j], the float32
// nearest 2^(j/32)/Th[j] − 1, both computed from 2^(j/32) to 300 bits.
var expTab = func() (tab struct{ th, tlr [32]float32 }) {
	const prec = 300
	for j := range 32 {
		// Newton on y^32 = 2^j from the float64 estimate.
		target := new(big.Float).SetPrec(prec).SetInt64(1 << j)
		y := new(big.Float).SetPrec(prec).SetFloat64(math.Exp2(float64(j) / 32))
		for range 6 {
			y31 := new(big.Float).SetPrec(prec).SetInt64(1)
			for range 31 {
				y31.Mul(y31, y)
			}
			step := new(big.Float).SetPrec(prec).Mul(y31, y)
			step.Sub(step, target)
			step.Quo(step, new(big.Float).SetPrec(prec).Mul(y31, big.NewFloat(32)))
			y.Sub(y, step)
		}
		th, _ := y.Float32()
		rel := new(big.Float).SetPrec(prec).Quo(y, new(big.Float).SetPrec(prec).SetFloat64(float64(th)))
		rel.Sub(rel, big.NewFloat(1))
		tab.th[j] = th
		tab.tlr[j], _ = rel.Float32()
	}
	return tab
}()

// sleefExp is ATen's Vectorized<float>::exp, SLEEF's expf_u10 in its AVX2
// and AVX-512 builds (with fused multiply-adds):
//
//   - q = rint(x·(1/ln2)), the product rounded to float32 first;
//   - s = x − q·ln2 in two fused steps (Cody–Waite: ln2 split into a 16-bit
//     head and the float32 nearest the rest);
//   - a degree-5 polynomial u in s by fused Horner steps, then
//     1 + fma(s·s, u, s), the square a plain float32 product;
//   - the result times 2^(q>>1) times 2^(q−q>>1), two float32 products, so
//     that no single power of two leaves the normal range;
//   - below −104 the result is +0, above 100 it is +Inf, and a NaN comes
//     back quieted with its payload (what x86 arithmetic does to it).
func sleefExp(x float32) float32 {
	switch {
	case x != x:
		return math.Float32frombits(math.Float32bits(x) | 1<<22)
	case x < -104:
		return 0
	case x > 100:
		return float32(math.Inf(1))
	}
	const (
		invLn2 float32 = 1.442695040888963407359924681001892137426645954152985934135449406931
		ln2Hi  float32 = 0.693145751953125
		ln2Lo  float32 = 1.428606765330187045e-06
	)
	q := int32(math.RoundToEven(float64(float32(x * invLn2))))
	qf := float32(q)
	s := fma32(qf, -ln2Hi, x)
	s = fma32(qf, -ln2Lo, s)
	u := sleefExpPoly[0]
	for _, c := range sleefExpPoly[1:] {
		u = fma32(u, s, c)
	}
	u = 1 + fma32(float32(s*s), u, s)
	h := q >> 1
	u = float32(u * pow2f(h))
	return float32(u * pow2f(q-h))
}

// sleefExpPoly are the polynomial's coefficients, highest degree first:
// double literals in the C source, each converted to float32 (hence the
// double rounding spelled out here).
var sleefExpPoly = [...]float32{
	float32(float64(0.000198527617612853646278381)),
	float32(float64(0.00139304355252534151077271)),
	float32(float64(0.00833336077630519866943359)),
	float32(float64(0.0416664853692054748535156)),
	float32(float64(0.166666671633720397949219)),
	float32(float64(0.5)),
}

// pow2f is 2^e for e in the normal float32 exponent range.
func pow2f(e int32) float32 { return math.Float32frombits(uint32(e+127) << 23) }

// torchExpF16 is torch.exp of a float16 tensor on the CPU for x, a float16
// value widened: SLEEF's exp rounded back to float16 (RNE), a NaN quieted
// keeping its float16 payload; the result widened again.
func torchExpF16(x float32) float32 {
	if x != x {
		b := math.Float32bits(x)
		return tensor.F16ToFloat32(uint16(b>>16)&0x8000 | 0x7e00 | uint16(b>>13)&0x3ff)
	}
	return tensor.F16ToFloat32(tensor.Float32ToF16(sleefExp(x)))
}

// fma32 is a·b + c rounded once to float32 (RNE), as a float32 FMA
// instruction computes it. Rounding math.FMA's float64 result to float32
// would round twice and can land on the wrong side of a float32 midpoint;
// instead the exact sum is rounded to float64 with round-to-odd (an inexact
// result keeps an odd last bit), which 53 ≥ 24+2 bits make safe to round
// again to float32.
func fma32(a, b, c float32) float32 {
	s, err := sum64(a, b, c)
	if bits := math.Float64bits(s); err != 0 && bits&1 == 0 {
		if (err > 0) == (s > 0) {
			bits++ // away from zero, towards the exact sum
		} else {
			bits--
		}
		s = math.Float64frombits(bits)
	}
	return float32(s)
}

// fma32RZ is a·b + c rounded once to float32 toward zero (an FMA with
// {rz-sae}).
func fma32RZ(a, b, c float32) float32 {
	s, err := sum64(a, b, c)
	f := float32(s)
	// d and the error are exact; the exact sum is s + err, and f lies
	// beyond it (away from zero) when f − s exceeds err in s's direction.
	if d := float64(f) - s; (s > 0 && d > err) || (s < 0 && d < err) {
		f = math.Nextafter32(f, 0)
	}
	return f
}

// sum64 returns a·b + c as s + err: s rounded to float64, err exact.
func sum64(a, b, c float32) (s, err float64) {
	p := float64(float64(a) * float64(b)) // exact: 24+24 significant bits
	z := float64(c)
	s = p + z
	bv := s - p // Knuth's TwoSum
	return s, (p - (s - bv)) + (z - bv)
}
