package mlxpack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/tensor"
)

// The test binary doubles as `ferry mlx quantize`: with FERRY_MLXQ_CHILD
// set to SRC:OUT:BITS:JOBS:JOURNAL_EVERY it converts SRC to OUT (plan,
// journal, resume) and exits: the kill test's child and the benchmark's
// measured process.
func init() {
	spec := os.Getenv("FERRY_MLXQ_CHILD")
	if spec == "" {
		return
	}
	if err := childQuantize(strings.Split(spec, ":")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func childQuantize(parts []string) error {
	if len(parts) != 5 {
		return fmt.Errorf("FERRY_MLXQ_CHILD: want SRC:OUT:BITS:JOBS:JOURNAL_EVERY, got %q", parts)
	}
	bits, err := strconv.Atoi(parts[2])
	if err != nil {
		return err
	}
	jobs, err := strconv.Atoi(parts[3])
	if err != nil {
		return err
	}
	every, err := time.ParseDuration(parts[4])
	if err != nil {
		return err
	}
	p, err := PlanQuantize(parts[0], QuantizeOptions{Bits: bits, GroupSize: 64})
	if err != nil {
		return err
	}
	defer p.Close()
	_, err = Quantize(context.Background(), p, parts[1], QuantizeRunOptions{Jobs: jobs, JournalEvery: every})
	return err
}

// readTree reads every file of an MLX directory.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, e := range ents {
		m[e.Name()] = mustRead(t, filepath.Join(dir, e.Name()))
	}
	return m
}

func sameTree(t *testing.T, what string, want, got map[string][]byte) {
	t.Helper()
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: unexpected file %s", what, name)
		}
	}
	for name, b := range want {
		if !bytes.Equal(got[name], b) {
			t.Errorf("%s: %s differs", what, name)
		}
	}
}

// killModel is a Qwen3.5 checkpoint of about 10 MB (BF16): over a
// hundred row blocks.
func killModel(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	o := testmodel.Qwen35Options{Common: testmodel.Common{VocabSize: 1024, HiddenSize: 512, IntermediateSize: 1024, NumLayers: 4,
		NumHeads: 4, NumKVHeads: 2, HeadDim: 128, MaxShardSize: 8 << 20}, Hybrid: testmodel.Hybrid{LinearKeyHeadDim: 64, LinearValueHeadDim: 64}}
	if _, err := o.Write(src); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestDeterministicJobs: the output is byte-identical whatever the
// worker count, with shards split (a small shard limit) and row blocks
// several per tensor.
func TestDeterministicJobs(t *testing.T) {
	var want map[string][]byte
	for _, jobs := range []int{1, 3, 8} {
		out := filepath.Join(t.TempDir(), "mlx")
		convertTo(t, qwen35Base, out, QuantizeOptions{Bits: 4, GroupSize: 32, ShardSize: 400_000}, QuantizeRunOptions{Jobs: jobs})
		got := readTree(t, out)
		if want == nil {
			want = got
			if _, ok := got["model-00001-of-00005.safetensors"]; !ok {
				t.Fatalf("want 5 shards, got %d files", len(got))
			}
			continue
		}
		sameTree(t, fmt.Sprintf("jobs %d", jobs), want, got)
	}
}

// TestResumeAfterCancel: a run cancelled after some row blocks leaves
// only OUT.partial (no OUT); the next run resumes the blocks recorded as
// durable and ends byte-identical to an uninterrupted run.
func TestResumeAfterCancel(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref")
	convertTo(t, qwen35Base, ref, QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 2})
	want := readTree(t, ref)

	out := filepath.Join(dir, "out")
	p, err := PlanQuantize(qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err = Quantize(ctx, p, out, QuantizeRunOptions{Jobs: 1, JournalEvery: time.Nanosecond, UnitDone: func(string, int64, int64) {
		if n++; n == 20 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists after a cancelled run", out)
	}
	if _, err := os.Stat(PartialDir(out)); err != nil {
		t.Fatal(err)
	}
	res, err := Quantize(context.Background(), p, out, QuantizeRunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.ResumedUnits < 19 {
		t.Errorf("resumed %d row blocks, want at least 19", res.ResumedUnits)
	}
	sameTree(t, "resumed", want, readTree(t, out))
	if _, err := os.Stat(PartialDir(out)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind", PartialDir(out))
	}
	// The per-tensor error figures of the resumed run are those of the
	// uninterrupted one (kept in the journal for resumed blocks).
	full := convertTo(t, qwen35Base, filepath.Join(dir, "again"), QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 3})
	for i, tr := range res.Tensors {
		a, b := tr, full.Tensors[i]
		if (a.RMSE == nil) != (b.RMSE == nil) || a.RMSE != nil && (*a.RMSE != *b.RMSE || *a.MaxAbsErr != *b.MaxAbsErr) {
			t.Errorf("%s: error figures differ after the resume", tr.Name)
		}
	}
}

// TestPartialOfOtherPlan: a partial directory left by another plan is
// started over, not trusted.
func TestPartialOfOtherPlan(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	p8, err := PlanQuantize(qwen3Base, QuantizeOptions{Bits: 8, GroupSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p8.Close()
	ctx, cancel := context.WithCancel(context.Background())
	Quantize(ctx, p8, out, QuantizeRunOptions{Jobs: 1, JournalEvery: time.Nanosecond, UnitDone: func(string, int64, int64) { cancel() }})
	convertTo(t, qwen3Base, out, QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 2})
	ref := filepath.Join(dir, "ref")
	convertTo(t, qwen3Base, ref, QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{Jobs: 2})
	sameTree(t, "after a partial of another plan", readTree(t, ref), readTree(t, out))
}

// A conversion SIGKILLed at 6 random moments, and run again after each,
// ends with the files of an uninterrupted run, and no kill leaves OUT
// that is not the whole output. The children journal every 10 ms, so
// most kills inside the write leave durable row blocks; the test fails
// unless some did (see killtest.AtRandom).
func TestQuantizeKillAtRandomPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a conversion 6 times; not in -short")
	}
	src := killModel(t)
	dir := t.TempDir()
	child := func(out string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_MLXQ_CHILD="+src+":"+out+":4:2:10ms")
		return cmd
	}
	ref := filepath.Join(dir, "ref")
	start := time.Now()
	if b, err := child(ref).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, b)
	}
	full := time.Since(start)
	want := readTree(t, ref)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, uninterrupted run %v", seed, full)
	rng := rand.New(rand.NewPCG(seed, 0x31c))
	out := filepath.Join(dir, "out")
	killtest.AtRandom(t, 6, full, rng, func() *exec.Cmd { return child(out) }, func(kill int) bool {
		if _, err := os.Stat(out); err != nil {
			return false
		}
		sameTree(t, fmt.Sprintf("kill %d: finished output", kill), want, readTree(t, out))
		os.RemoveAll(out)
		return true
	}, func() bool {
		j, err := os.ReadFile(filepath.Join(PartialDir(out), journalName))
		return err == nil && bytes.Contains(j, []byte(`"unit"`))
	})
	if b, err := child(out).CombinedOutput(); err != nil {
		t.Fatalf("last run: %v: %s", err, b)
	}
	sameTree(t, "after 6 kills", want, readTree(t, out))
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("left in the directory: %d entries, want ref and out", len(ents))
	}
}

// TestBadInput: each refusal is bad input (exit 2) or usage, names what
// is wrong, and writes nothing.
func TestQuantizeBadInput(t *testing.T) {
	fixture := func(t *testing.T, edit func(cfg map[string]any)) string {
		src := filepath.Join(t.TempDir(), "src")
		copyTree(t, qwen3Base, src)
		if edit != nil {
			editConfig(t, src, edit)
		}
		return src
	}
	cases := []struct {
		name  string
		src   func(t *testing.T) string
		opts  QuantizeOptions
		kind  errkind.Kind
		is    error
		words string
	}{
		{"bits", func(t *testing.T) string { return qwen3Base }, QuantizeOptions{Bits: 7}, errkind.Usage, ErrQuantArgs, "7"},
		{"group size", func(t *testing.T) string { return qwen3Base }, QuantizeOptions{Bits: 4, GroupSize: 48}, errkind.Usage, ErrQuantArgs, "48"},
		{"recipe", func(t *testing.T) string { return qwen3Base }, QuantizeOptions{Bits: 4, Recipe: "mixed_9_9"}, errkind.Usage, ErrQuantArgs, "mixed_9_9"},
		{"recipe without bits", func(t *testing.T) string { return qwen3Base }, QuantizeOptions{Recipe: "mixed_3_6"}, errkind.Usage, ErrQuantArgs, "--bits"},
		{"dtype", func(t *testing.T) string { return qwen3Base }, QuantizeOptions{DType: "f8"}, errkind.Usage, ErrQuantArgs, "f8"},
		{"forced indivisible", oddModel, QuantizeOptions{Bits: 4, GroupSize: 64, ModuleBits: []ModuleBits{{Pattern: regexp.MustCompile(`mlp\.up_proj`), Bits: 8}}}, errkind.BadInput, ErrNotDivisible, "model.layers.0.mlp.up_proj"},
		{"unknown family", func(t *testing.T) string {
			return fixture(t, func(c map[string]any) { c["model_type"] = "gpt_neox" })
		}, QuantizeOptions{Bits: 4}, errkind.BadInput, ErrUnsupportedFamily, "qwen3_5"},
		{"already MLX", func(t *testing.T) string {
			return fixture(t, func(c map[string]any) { c["quantization"] = map[string]any{"bits": 4, "group_size": 64} })
		}, QuantizeOptions{Bits: 4}, errkind.BadInput, ErrQuantized, "quantization"},
		{"already quantized (fp8)", func(t *testing.T) string {
			return fixture(t, func(c map[string]any) { c["quantization_config"] = map[string]any{"quant_method": "fp8"} })
		}, QuantizeOptions{Bits: 4}, errkind.BadInput, ErrQuantized, "fp8"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "mlx")
			p, err := PlanQuantize(tc.src(t), tc.opts)
			if err == nil {
				_, err = Quantize(context.Background(), p, out, QuantizeRunOptions{})
				p.Close()
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if k := errkind.Of(err); k != tc.kind {
				t.Errorf("kind %v, want %v: %v", k, tc.kind, err)
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("%v: not %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.words) {
				t.Errorf("%v: does not say %q", err, tc.words)
			}
			for _, p := range []string{out, PartialDir(out)} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s written", p)
				}
			}
		})
	}
}

// oddModel is a Qwen3 whose hidden size (96) no group size of 64 or 128
// divides: mlx-lm leaves every module that reads it float.
func oddModel(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "odd")
	o := testmodel.Qwen3Options{Common: testmodel.Common{VocabSize: 320, HiddenSize: 96, IntermediateSize: 128, NumLayers: 2, NumHeads: 2, NumKVHeads: 1, HeadDim: 64}}
	if _, err := o.Write(src); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestIndivisibleStaysFloat: as mlx-lm's wrapped_predicate, a module whose
// input dimension the group size does not divide stays float, with no
// config entry; the others are quantized.
func TestIndivisibleStaysFloat(t *testing.T) {
	out := filepath.Join(t.TempDir(), "mlx")
	res := convertTo(t, oddModel(t), out, QuantizeOptions{Bits: 4, GroupSize: 64}, QuantizeRunOptions{})
	quantized := map[string]bool{}
	for _, tr := range res.Tensors {
		quantized[tr.Module] = tr.Bits > 0
	}
	for mod, want := range map[string]bool{
		"model.layers.0.mlp.up_proj":      false, // in = hidden 96
		"model.layers.0.self_attn.q_proj": false,
		"model.embed_tokens":              false,
		"model.layers.0.mlp.down_proj":    true, // in = intermediate 128
		"model.layers.0.self_attn.o_proj": true, // in = 2 heads · 64
		"model.layers.1.self_attn.k_norm": false,
	} {
		if quantized[mod] != want {
			t.Errorf("%s quantized = %v, want %v", mod, quantized[mod], want)
		}
	}
	if len(res.Quantization) != 3 {
		t.Errorf("quantization block %v: want the global entries only", res.Quantization)
	}
}

// TestCast: --dtype casts every float parameter but the ones the family's
// cast_predicate keeps (A_log for Qwen3.5), before quantizing: scales and
// biases are in the cast dtype.
func TestCast(t *testing.T) {
	out := filepath.Join(t.TempDir(), "mlx")
	res := convertTo(t, qwen35Base, out, QuantizeOptions{Bits: 4, GroupSize: 64, DType: "f16"}, QuantizeRunOptions{})
	got := readOutputs(t, out)
	aLog := 0
	for name, o := range got {
		want := tensor.F16
		switch {
		case strings.HasSuffix(name, "A_log"):
			want = tensor.BF16
			aLog++
		case strings.HasSuffix(name, ".weight") && o.dtype == tensor.U32:
			continue
		}
		if o.dtype != want {
			t.Errorf("%s: %s, want %s", name, o.dtype, want)
		}
	}
	if aLog != 3 || res.DType != tensor.F16 {
		t.Errorf("%d A_log tensors, result dtype %s", aLog, res.DType)
	}
}

// quantErr gives, bit for bit, the figures of the plain sum (one group at a
// time, each group's float32 sums in element order, added to the float64
// totals in group order), for odd and even group counts, every bit width
// and group size.
func TestQuantErrFigures(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bits := range AffineBits {
		for _, gs := range AffineGroupSizes {
			for _, groups := range []int{1, 2, 3, 8} {
				cols := gs
				vals := make([]float32, groups*gs)
				for i := range vals {
					vals[i] = tensor.RoundTo(tensor.BF16, float32(rng.NormFloat64()*0.02))
				}
				wq := make([]byte, len(vals)*bits/8)
				sc, bi := make([]byte, groups*2), make([]byte, groups*2)
				if err := AffineQuantize(vals, cols, gs, bits, tensor.BF16, wq, sc, bi); err != nil {
					t.Fatal(err)
				}
				var tmp []float32
				got := quantErr(vals, wq, sc, bi, gs, bits, tensor.BF16, &tmp)
				var want unitStats
				codes := make([]float32, gs)
				for g := range groups {
					unpackCodes(codes, wq[g*gs*bits/8:], bits)
					s, b := getScale(sc[2*g:], tensor.BF16), getScale(bi[2*g:], tensor.BF16)
					var sqErr, sq float32
					var maxErr float32
					for i, v := range vals[g*gs : (g+1)*gs] {
						d := codes[i]*s + b - v
						sqErr += d * d
						sq += v * v
						maxErr = max(maxErr, abs32(d))
					}
					want.sqErr += float64(sqErr)
					want.sq += float64(sq)
					want.maxErr = max(want.maxErr, float64(maxErr))
				}
				if got != want {
					t.Errorf("bits %d, group %d, %d groups: %+v, want %+v", bits, gs, groups, got, want)
				}
			}
		}
	}
}
