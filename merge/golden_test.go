package merge

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// The golden cases: PEFT 0.21 merge_and_unload outputs from the reference
// set (testdata/reference/PROVENANCE.md), each as the sha256 of every
// tensor's bytes with its dtype and shape (merged: a .tensors.sha256 file,
// see peftSums).
var goldenCases = []struct {
	name, base, adapter, merged, fp32 string
	tensors, peftTensors              int
}{
	{"qwen3-dora", "testdata/reference/qwen3/base", "testdata/reference/qwen3/adapters/dora",
		"testdata/reference/qwen3/merged_dora.tensors.sha256", "testdata/reference/qwen3/fp32_reference/merged_dora_fp32_targets.safetensors", 24, 24},
	{"qwen3-rslora", "testdata/reference/qwen3/base", "testdata/reference/qwen3/adapters/rslora",
		"testdata/reference/qwen3/merged_rslora.tensors.sha256", "", 24, 24},
	{"qwen35-dora", "../testdata/models/qwen35-tiny/base", "../testdata/models/qwen35-tiny/adapter-dora",
		"testdata/reference/qwen35/merged_dora.tensors.sha256", "testdata/reference/qwen35/fp32_reference/merged_dora_fp32_targets.safetensors", 71, 56},
}

// tensorSum is one tensor of a reference output: the sha256 of its bytes,
// its dtype and shape as ferry prints them.
type tensorSum struct{ sum, dtype, shape string }

// peftSums reads a .tensors.sha256 file: "SHA256  DTYPE [SHAPE] NAME" a
// line, # comments.
func peftSums(t testing.TB, path string) map[string]tensorSum {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]tensorSum{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			t.Fatalf("%s: bad line %q", path, line)
		}
		m[f[len(f)-1]] = tensorSum{sum: f[0], dtype: f[1], shape: strings.Join(f[2:len(f)-1], " ")}
	}
	return m
}

func readTensor(t testing.TB, c *safetensors.Checkpoint, name string) (safetensors.TensorInfo, []byte) {
	t.Helper()
	l, ok := c.Lookup(name)
	if !ok {
		t.Fatalf("%s: no tensor %q", c.Dir, name)
	}
	buf := make([]byte, l.Info.Size())
	if _, err := l.Section().ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return l.Info, buf
}

func runMerge(t testing.TB, base, adapter, out string, popt PlanOptions, jobs int) (*Plan, *Result) {
	t.Helper()
	p, err := Inventory(base, adapter, popt)
	if err != nil {
		t.Fatalf("Inventory: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	res, err := Execute(context.Background(), p, out, ExecOptions{Jobs: jobs})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return p, res
}

// TestGoldenPEFT: every merged tensor equals PEFT's bf16 output bit for bit,
// every other tensor equals the base, and the float32 merges equal PEFT's
// float32 merges.
func TestGoldenPEFT(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "merged")
			p, _ := runMerge(t, gc.base, gc.adapter, out, PlanOptions{}, 2)
			got, err := safetensors.OpenDir(out)
			if err != nil {
				t.Fatalf("output is not a checkpoint: %v", err)
			}
			defer got.Close()
			base, err := safetensors.OpenDir(gc.base)
			if err != nil {
				t.Fatal(err)
			}
			defer base.Close()
			peft := peftSums(t, gc.merged)
			if n := len(got.Tensors()); n != gc.tensors {
				t.Errorf("output has %d tensors, want %d", n, gc.tensors)
			}
			if n := len(peft); n != gc.peftTensors {
				t.Fatalf("PEFT reference has %d tensors, want %d", n, gc.peftTensors)
			}
			targets := map[string]bool{}
			for _, m := range p.Modules {
				targets[m.Target] = true
			}
			var elems, same, mtp int
			for _, l := range base.Tensors() {
				name := l.Info.Name
				gi, gb := readTensor(t, got, name)
				_, bb := readTensor(t, base, name)
				if !targets[name] {
					if !bytes.Equal(gb, bb) {
						t.Errorf("untargeted tensor %q differs from the base", name)
					}
					if strings.HasPrefix(name, "mtp.") {
						mtp++
						if _, ok := peft[name]; ok {
							t.Errorf("PEFT reference unexpectedly has %q", name)
						}
						continue
					}
				}
				want, ok := peft[name]
				if !ok {
					t.Fatalf("%q: not in PEFT's output", name)
				}
				if fmt.Sprint(gi.DType) != want.dtype || fmt.Sprint(gi.Shape) != want.shape {
					t.Fatalf("%q: %s %v, PEFT %s %s", name, gi.DType, gi.Shape, want.dtype, want.shape)
				}
				n := len(gb) * 8 / gi.DType.Bits()
				elems += n
				if sum := sha256.Sum256(gb); hex.EncodeToString(sum[:]) == want.sum {
					same += n
				} else if targets[name] {
					t.Errorf("merged %q differs from PEFT's output", name)
				} else {
					t.Errorf("untargeted %q differs from PEFT's output", name)
				}
			}
			t.Logf("%s: %d merged tensors, %d elements, in tensors identical to PEFT's %d; %d mtp.* tensors kept verbatim",
				gc.name, len(targets), elems, same, mtp)
			if same != elems {
				t.Errorf("%d of %d merged elements differ from PEFT", elems-same, elems)
			}
			if gc.name == "qwen35-dora" && mtp != 15 {
				t.Errorf("%d mtp.* tensors, want 15", mtp)
			}
			// Shards without targeted tensors are identical files.
			for _, sp := range p.Shards {
				if sp.Rewrite {
					continue
				}
				a, _ := os.ReadFile(filepath.Join(gc.base, sp.Name))
				b, _ := os.ReadFile(filepath.Join(out, sp.Name))
				if !bytes.Equal(a, b) {
					t.Errorf("untargeted shard %s is not a byte copy", sp.Name)
				}
			}
			for _, a := range []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} {
				x, _ := os.ReadFile(filepath.Join(gc.base, a))
				y, err := os.ReadFile(filepath.Join(out, a))
				if err != nil || !bytes.Equal(x, y) {
					t.Errorf("%s not copied verbatim: %v", a, err)
				}
			}
		})
	}
}

// TestGoldenFP32: merged in float32 (--dtype f32), the targets equal PEFT's
// float32 merges (bit for bit; the acceptance bound is 1e-6 relative).
func TestGoldenFP32(t *testing.T) {
	for _, gc := range goldenCases {
		if gc.fp32 == "" {
			continue
		}
		t.Run(gc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "merged")
			runMerge(t, gc.base, gc.adapter, out, PlanOptions{DType: tensor.F32}, 2)
			got, err := safetensors.OpenDir(out)
			if err != nil {
				t.Fatal(err)
			}
			defer got.Close()
			ref, err := safetensors.Open(gc.fp32)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			for _, ti := range ref.Tensors {
				rb := make([]byte, ti.Size())
				if _, err := ref.Section(ti).ReadAt(rb, 0); err != nil {
					t.Fatal(err)
				}
				gi, gb := readTensor(t, got, ti.Name)
				if gi.DType != tensor.F32 || len(gb) != len(rb) {
					t.Fatalf("%q: got %s %v", ti.Name, gi.DType, gi.Shape)
				}
				g := make([]float32, len(gb)/4)
				r := make([]float32, len(rb)/4)
				tensor.BytesToF32(g, gb)
				tensor.BytesToF32(r, rb)
				exact, worst := 0, 0.0
				for i := range g {
					if g[i] == r[i] {
						exact++
					}
					rel := math.Abs(float64(g[i])-float64(r[i])) / math.Max(math.Abs(float64(r[i])), 1e-30)
					worst = math.Max(worst, rel)
				}
				t.Logf("%s: %d/%d float32 elements bit-identical to PEFT, max relative difference %.3g", ti.Name, exact, len(g), worst)
				if worst > 1e-6 {
					t.Errorf("%s: max relative difference %.3g > 1e-6", ti.Name, worst)
				}
				if exact != len(g) {
					t.Errorf("%s: %d of %d elements not bit-identical", ti.Name, len(g)-exact, len(g))
				}
			}
		})
	}
}
