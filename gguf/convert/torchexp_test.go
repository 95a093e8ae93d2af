package convert

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

var torchExpAll = flag.Bool("torchexp-all", false, "check torchExpF32 on all 2^32 float32 inputs against torch's chunk digests in testdata/torch/info.json (minutes of CPU)")

// readTorchFile reads testdata/torch/name and checks its recorded sha256.
func readTorchFile(t *testing.T, name, sum string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "torch", name))
	if err != nil {
		t.Fatal(err)
	}
	if d := sha256.Sum256(b); hex.EncodeToString(d[:]) != sum {
		t.Fatalf("%s: sha256 %x, PROVENANCE.md records %s", name, d, sum)
	}
	return b
}

// expMismatches compares f with torch's outputs bit for bit and returns
// how many inputs differ and a description of the first few.
func expMismatches(in []float32, want []uint32, f func(float32) float32) (int, string) {
	n, first := 0, ""
	for i, x := range in {
		if got := math.Float32bits(f(x)); got != want[i] {
			if n < 5 {
				first += fmt.Sprintf("\n  x=%g (%#08x): got %#08x (%g), torch %#08x (%g)",
					x, math.Float32bits(x), got, math.Float32frombits(got), want[i], math.Float32frombits(want[i]))
			}
			n++
		}
	}
	return n, first
}

// correctlyRounded is what ferry computed before: exp rounded once from
// float64, which is not torch's function.
func correctlyRounded(x float32) float32 { return float32(math.Exp(float64(x))) }

// bf16Inputs is every bf16 bit pattern widened to float32, in order.
func bf16Inputs() []float32 {
	in := make([]float32, 1<<16)
	for i := range in {
		in[i] = tensor.BF16ToFloat32(uint16(i))
	}
	return in
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// TestTorchExpF32BF16 checks every bf16 input (what a bf16 A_log holds
// once the converter widens it) against torch 2.11's exp of a float32
// tensor.
func TestTorchExpF32BF16(t *testing.T) {
	want := u32s(readTorchFile(t, "exp_bf16.f32le", "92b8c727631bf146fcf33d69e9df40c5f30cc14669d3c222427848148d3edb8e"))
	in := bf16Inputs()
	if n, first := expMismatches(in, want, torchExpF32); n != 0 {
		t.Errorf("torchExpF32 differs from torch on %d of %d bf16 inputs:%s", n, len(in), first)
	}
	// The golden tells the functions apart: a correctly rounded exp misses
	// it on 225 inputs (PROVENANCE.md), SLEEF's on 470.
	for _, c := range []struct {
		name string
		f    func(float32) float32
		n    int
	}{{"float32(math.Exp)", correctlyRounded, 225}, {"sleefExp", sleefExp, 470}} {
		if n, _ := expMismatches(in, want, c.f); n != c.n {
			t.Errorf("%s differs from torch's float32 exp on %d bf16 inputs, want %d", c.name, n, c.n)
		}
	}
}

// TestTorchExpF32Sample checks 262,144 float32 inputs (any bit pattern,
// the live range, A_log's range, the range-reduction boundaries).
func TestTorchExpF32Sample(t *testing.T) {
	b := readTorchFile(t, "exp_f32_sample.u32le", "207daf985b56ba8ee2259bcc9e5d1ba1a3c167ecc4101a4236dfc623f4eca122")
	pairs := u32s(b)
	in := make([]float32, len(pairs)/2)
	want := make([]uint32, len(pairs)/2)
	for i := range in {
		in[i] = math.Float32frombits(pairs[2*i])
		want[i] = pairs[2*i+1]
	}
	if m, first := expMismatches(in, want, torchExpF32); m != 0 {
		t.Errorf("torchExpF32 differs from torch on %d of %d float32 inputs:%s", m, len(in), first)
	}
	if m, _ := expMismatches(in, want, correctlyRounded); m == 0 {
		t.Error("float32(math.Exp) matches the whole sample: the sample cannot tell the functions apart")
	}
}

// TestSleefExpBF16 checks sleefExp against torch's Vectorized<float>::exp
// (torch.compile's CPU code for torch.exp of a float32 tensor) on every
// bf16 input.
func TestSleefExpBF16(t *testing.T) {
	want := u32s(readTorchFile(t, "exp_bf16_vectorized.f32le", "46b5cf9fdc610a80be4bcd5ff9bdcf47ebde72456d2646c3028d554f553e07ab"))
	if n, first := expMismatches(bf16Inputs(), want, sleefExp); n != 0 {
		t.Errorf("sleefExp differs from torch's Vectorized<float>::exp on %d bf16 inputs:%s", n, first)
	}
}

// TestTorchExpF16 checks every float16 input (an F16 A_log, which the
// converter keeps as F16) against torch.exp of a float16 tensor.
func TestTorchExpF16(t *testing.T) {
	b := readTorchFile(t, "exp_f16.f16le", "47bf57c446adb91bb2be775a0c40f9908230dc6a2021f9791f564131be654bd5")
	n, first := 0, ""
	naive := 0
	for i := range 1 << 16 {
		x := tensor.F16ToFloat32(uint16(i))
		want := binary.LittleEndian.Uint16(b[2*i:])
		// Through float32 and back, as the converter writes the F32 ssm_a.
		wantF32 := math.Float32bits(tensor.F16ToFloat32(want))
		if got := math.Float32bits(torchExpF16(x)); got != wantF32 {
			if n < 5 {
				first += fmt.Sprintf("\n  x=%g (f16 %#04x): got %#08x, torch %#04x (%#08x)", x, i, got, want, wantF32)
			}
			n++
		}
		// What ferry wrote before: exp of the widened value, not rounded
		// back to float16.
		if x == x && math.Float32bits(correctlyRounded(x)) != wantF32 {
			naive++
		}
	}
	if n != 0 {
		t.Errorf("torchExpF16 differs from torch on %d of 65536 float16 inputs:%s", n, first)
	}
	if naive == 0 {
		t.Error("float32(math.Exp) matches torch's float16 exp everywhere: the golden cannot tell them apart")
	}
	t.Logf("float32(math.Exp), not rounded to float16, differs on %d inputs", naive)
}

// torchExpMisses reads the inputs on which torchExpF32 is known to differ
// from torch (by one ulp): triples of input, torch's output, ferry's.
func torchExpMisses(t *testing.T) [][3]uint32 {
	w := u32s(readTorchFile(t, "exp_f32_misses.u32le", "f8b32dd2c57b2addea6505a4857b84b8908448603e77d8d0cb8a2708413fdd76"))
	out := make([][3]uint32, len(w)/3)
	for i := range out {
		out[i] = [3]uint32{w[3*i], w[3*i+1], w[3*i+2]}
	}
	return out
}

// TestTorchExpF32Misses: on the 16,053 float32 inputs (of 2^32) where
// torch's value was measured to differ from the kernel's, the kernel is one
// ulp off and gives the value recorded; torchExpF32 gives torch's. The
// embedded corrections are exactly the measured pairs, nothing more.
func TestTorchExpF32Misses(t *testing.T) {
	misses := torchExpMisses(t)
	if len(misses) != 16053 {
		t.Fatalf("%d known misses, PROVENANCE.md says 16,053", len(misses))
	}
	fix := torchExpFixups()
	if len(fix.in) != len(misses) {
		t.Fatalf("torchexp_fixups.u32le holds %d corrections, testdata %d", len(fix.in), len(misses))
	}
	for i, m := range misses {
		x := math.Float32frombits(m[0])
		if fix.in[i] != m[0] || fix.out[i] != m[1] {
			t.Fatalf("correction %d: (%#08x, %#08x), measured (%#08x, %#08x)", i, fix.in[i], fix.out[i], m[0], m[1])
		}
		if d := int64(m[1]) - int64(m[2]); d != 1 && d != -1 {
			t.Fatalf("x=%g: recorded miss of %d ulp", x, d)
		}
		if got := math.Float32bits(torchExpKernel(x)); got != m[2] {
			t.Fatalf("x=%g (%#08x): kernel %#08x, recorded %#08x", x, m[0], got, m[2])
		}
		if got := math.Float32bits(torchExpF32(x)); got != m[1] {
			t.Fatalf("x=%g (%#08x): %#08x, torch %#08x", x, m[0], got, m[1])
		}
		// Neighbours without a correction keep the kernel's value.
		if x1 := m[0] + 1; i+1 == len(misses) || misses[i+1][0] != x1 {
			if a, b := torchExpF32(math.Float32frombits(x1)), torchExpKernel(math.Float32frombits(x1)); math.Float32bits(a) != math.Float32bits(b) {
				t.Fatalf("x=%#08x: corrected to %#08x without a measured correction", x1, math.Float32bits(a))
			}
		}
	}
}

func TestParseExpFixups(t *testing.T) {
	le := func(w ...uint32) []byte {
		b := make([]byte, 4*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
		err  string
	}{
		{"empty", nil, ""},
		{"one", le(0x3f800001, 0x402df855), ""},
		{"odd length", le(1, 2, 3)[:10], "multiple of 8"},
		{"descending", le(5, 1, 4, 1), "ascending"},
		{"repeated", le(5, 1, 5, 2), "ascending"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseExpFixups(tc.data)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range f.in {
				if y, ok := f.lookup(f.in[i]); !ok || y != f.out[i] {
					t.Errorf("lookup(%#x) = %#x, %v", f.in[i], y, ok)
				}
				if _, ok := f.lookup(f.in[i] + 1); ok {
					t.Errorf("lookup(%#x) found a correction that is not there", f.in[i]+1)
				}
			}
		})
	}
}

// TestTorchExpAllFloat32 runs torchExpF32 over all 2^32 float32 bit
// patterns in torch's 16 chunks and compares each chunk's sha256 with
// torch's: torchExpF32 is torch's function on every float32 input.
func TestTorchExpAllFloat32(t *testing.T) {
	if !*torchExpAll {
		t.Skip("exhaustive check; run with -torchexp-all")
	}
	b := readTorchFile(t, "info.json", torchInfoSHA256)
	var info struct {
		Chunks []string `json:"chunk_sha256"`
	}
	if err := json.Unmarshal(b, &info); err != nil || len(info.Chunks) != 16 {
		t.Fatalf("info.json: %v, %d chunks", err, len(info.Chunks))
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	got := make([]string, 16)
	for k := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			h := sha256.New()
			buf := make([]byte, 4<<20)
			for lo := uint64(k) << 28; lo < uint64(k+1)<<28; lo += uint64(len(buf) / 4) {
				for i := range len(buf) / 4 {
					x := uint32(lo) + uint32(i)
					y := math.Float32bits(torchExpF32(math.Float32frombits(x)))
					binary.LittleEndian.PutUint32(buf[4*i:], y)
				}
				h.Write(buf)
			}
			got[k] = hex.EncodeToString(h.Sum(nil))
		}()
	}
	wg.Wait()
	for k := range 16 {
		if got[k] != info.Chunks[k] {
			t.Errorf("chunk %d (bit patterns %#08x..%#08x): sha256 %s, torch %s", k, k<<28, (k+1)<<28-1, got[k], info.Chunks[k])
		}
	}
}

// TestFMA32 checks fma32 against exact rational arithmetic, on inputs
// where rounding the float64 fma to float32 would round twice wrongly and
// on random ones.
func TestFMA32(t *testing.T) {
	exact := func(a, b, c float32) float32 {
		var r big.Float
		r.SetPrec(0).SetMode(big.ToNearestEven)
		p := new(big.Float).SetPrec(1000).SetFloat64(float64(a))
		p.Mul(p, new(big.Float).SetPrec(1000).SetFloat64(float64(b)))
		p.Add(p, new(big.Float).SetPrec(1000).SetFloat64(float64(c)))
		f, _ := p.Float32()
		return f
	}
	f32 := math.Float32frombits
	cases := []struct{ a, b, c float32 }{
		// a·b = -2^-24·(1+2^-23)·(1-2^-23) = -2^-24 + 2^-70, c = 1+3·2^-23:
		// the exact sum lies 2^-70 above the midpoint between 1+2^-22 and
		// 1+3·2^-23, so it rounds up; in float64 the 2^-70 is lost, the
		// midpoint ties to even and float32(math.FMA(…)) rounds down.
		{f32(0xb3800001), f32(0x3f7ffffe), f32(0x3f800003)},
		// The mirror image below zero.
		{f32(0x33800001), f32(0x3f7ffffe), f32(0xbf800003)},
		{0.5, f32(0x00000003), 0},                           // a subnormal tie
		{f32(0x7f7fffff), 2, -f32(0x7f7fffff)},              // product beyond float32
		{-0.0, 1, 0},                                        // signed zero
		{f32(0x00800000), f32(0x3f000000), f32(0x80000001)}, // subnormal result
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		a := f32(r.Uint32() & 0x3fffffff)
		b := f32(r.Uint32()&0x3fffffff | r.Uint32()&0x80000000)
		// c near -a·b, so that cancellation and ties are frequent.
		c := -float32(float64(a)*float64(b)) * (1 + float32(r.IntN(9)-4)/(1<<23))
		cases = append(cases, struct{ a, b, c float32 }{a, b, c})
	}
	wrongTwice := 0
	for _, tc := range cases {
		want := exact(tc.a, tc.b, tc.c)
		if got := fma32(tc.a, tc.b, tc.c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%#08x), exact rounding %g (%#08x)", tc.a, tc.b, tc.c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
		if math.Float32bits(float32(math.FMA(float64(tc.a), float64(tc.b), float64(tc.c)))) != math.Float32bits(want) {
			wrongTwice++
		}
	}
	if wrongTwice < 2 {
		t.Errorf("float32(math.FMA(...)) rounded all but %d cases right: the first two must catch double rounding", wrongTwice)
	}
	t.Logf("float32(math.FMA) rounded %d of %d cases wrongly; fma32 none", wrongTwice, len(cases))
}

// torchInfoSHA256 is the sha256 of testdata/torch/info.json.
const torchInfoSHA256 = "9fa0b50fe80b25202376a6f6b4e2e017123d4f84408b537b1bb40e689d4e0b87"

// TestSSMAExpLikeTorch converts a Qwen3.5 checkpoint whose A_log holds
// inputs on which torch's exp is not the correctly rounded one, stored as
// BF16, F32 and F16, and checks blk.0.ssm_a against torch's outputs for
// them (-exp, V-head reordered).
func TestSSMAExpLikeTorch(t *testing.T) {
	bf16Gold := u32s(readTorchFile(t, "exp_bf16.f32le", "92b8c727631bf146fcf33d69e9df40c5f30cc14669d3c222427848148d3edb8e"))
	sample := u32s(readTorchFile(t, "exp_f32_sample.u32le", "207daf985b56ba8ee2259bcc9e5d1ba1a3c167ecc4101a4236dfc623f4eca122"))
	f16Gold := readTorchFile(t, "exp_f16.f16le", "47bf57c446adb91bb2be775a0c40f9908230dc6a2021f9791f564131be654bd5")
	// inputs returns up to n A_log values in [0, 4) (where A_log lives)
	// that torch maps elsewhere than a correctly rounded float32 exp,
	// with torch's outputs.
	type pick func(n int) (in, out []float32)
	cases := []struct {
		dt   tensor.DType
		pick pick
	}{
		{tensor.BF16, func(n int) (in, out []float32) {
			for i := 0; i < 1<<15 && len(in) < n; i++ {
				x := tensor.BF16ToFloat32(uint16(i))
				if y := math.Float32frombits(bf16Gold[i]); x < 4 && y != correctlyRounded(x) {
					in, out = append(in, x), append(out, y)
				}
			}
			return in, out
		}},
		{tensor.F32, func(n int) (in, out []float32) {
			for i := 0; 2*i < len(sample) && len(in) < n; i++ {
				x, y := math.Float32frombits(sample[2*i]), math.Float32frombits(sample[2*i+1])
				if x >= 0 && x < 4 && y != correctlyRounded(x) {
					in, out = append(in, x), append(out, y)
				}
			}
			return in, out
		}},
		{tensor.F16, func(n int) (in, out []float32) {
			for i := 0; i < 1<<15 && len(in) < n; i++ {
				x := tensor.F16ToFloat32(uint16(i))
				y := tensor.F16ToFloat32(binary.LittleEndian.Uint16(f16Gold[2*i:]))
				if x >= 0.5 && x < 4 && y != correctlyRounded(x) {
					in, out = append(in, x), append(out, y)
				}
			}
			return in, out
		}},
	}
	for _, c := range cases {
		t.Run(string(c.dt), func(t *testing.T) {
			dir := t.TempDir()
			m, err := (testmodel.Qwen35Options{Common: testmodel.Common{DTypeOverrides: map[string]tensor.DType{"A_log": c.dt}}}).Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			nk, nv := cfgInt(m, "linear_num_key_heads"), cfgInt(m, "linear_num_value_heads")
			in, out := c.pick(nv)
			if len(in) != nv {
				t.Fatalf("found %d inputs, want %d", len(in), nv)
			}
			name := m.Prefix + "layers.0.linear_attn.A_log"
			setTensor(t, dir, name, c.dt, in)
			gg, _ := convertDir(t, dir, Options{OutType: OutF16}, WriteOptions{})
			f := openGGUF(t, gg)
			want := make([]float32, nv)
			for i, y := range out {
				want[i] = -y
			}
			want = tiledV(want, nk, nv/nk, 1)
			got := values(t, f, "blk.0.ssm_a")
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Errorf("ssm_a[%d] = %g (%#08x), torch %g (%#08x)", i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
			}
		})
	}
}

// setTensor overwrites a checkpoint tensor's values in place.
func setTensor(t *testing.T, dir, name string, dt tensor.DType, v []float32) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	loc, ok := ck.Lookup(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	off := loc.Shard.DataOffset() + loc.Info.Begin
	ck.Close()
	b := make([]byte, loc.Info.Size())
	if err := tensor.FromF32(dt, b, v); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(filepath.Join(dir, loc.Shard.Name), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestNormPlusOneF16: the converter widens every dtype but float16 to
// float32 before modify_tensors (conversion/base.py prepare_tensors), so
// the Qwen3.5 RMSNorm weights of an F16 checkpoint get their +1 as torch's
// half add: the float32 sum rounded to float16. A BF16 or F32 checkpoint's
// sum stays float32.
func TestNormPlusOneF16(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.F16, tensor.BF16, tensor.F32} {
		t.Run(string(dt), func(t *testing.T) {
			dir := t.TempDir()
			m, err := (testmodel.Qwen35Options{Common: testmodel.Common{DType: dt}}).Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			n := cfgInt(m, "hidden_size")
			// Half values whose last two bits do not survive the +1: in
			// [0.25, 0.5) a half has 2^-12 steps, in [1, 2) 2^-10.
			in := make([]float32, n)
			for i := range in {
				in[i] = tensor.F16ToFloat32(0x3400 + uint16(i*37%1024))
			}
			setTensor(t, dir, m.Prefix+"layers.0.input_layernorm.weight", dt, in)
			b := make([]byte, n*dt.Bits()/8)
			if err := tensor.FromF32(dt, b, in); err != nil {
				t.Fatal(err)
			}
			if err := tensor.ToF32(dt, in, b); err != nil { // the values as stored
				t.Fatal(err)
			}
			gg, _ := convertDir(t, dir, Options{OutType: OutF16}, WriteOptions{})
			got := values(t, openGGUF(t, gg), "blk.0.attn_norm.weight")
			rounded := 0
			for i, x := range in {
				want := x + 1
				if dt == tensor.F16 {
					want = tensor.F16ToFloat32(tensor.Float32ToF16(want))
				}
				if want != x+1 {
					rounded++
				}
				if math.Float32bits(got[i]) != math.Float32bits(want) {
					t.Errorf("attn_norm[%d] = %g, want %g (input %g)", i, got[i], want, x)
				}
			}
			if dt == tensor.F16 && rounded == 0 {
				t.Fatal("no input whose +1 rounds in float16: the test checks nothing")
			}
		})
	}
}
