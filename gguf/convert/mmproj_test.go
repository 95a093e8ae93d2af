package convert

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/internal/ggufcheck"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// testdata/qwen35vl (PROVENANCE.md there): the reference's --mmproj output
// and the 33 model.visual.* tensors of its base, byte for byte.
const (
	vlDir        = "testdata/qwen35vl/base"
	vlMMProj     = "testdata/qwen35vl/mmproj-base-F16.gguf"
	vlMMProjSHA  = "1ae17f7fb2f614b7a2cea8736b593356e2ef96560fc6dd0d710a3352d2bbcd72"
	vlMMProjSize = 617472
)

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func planMMProj(t *testing.T, dir string, opts Options) (*safetensors.Checkpoint, *Plan, error) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	opts.MMProj = true
	p, err := NewPlan(ck, opts)
	return ck, p, err
}

// TestGoldenMMProjF16: ferry's --mmproj of the reference base is
// convert_hf_to_gguf.py --mmproj --outtype f16's file byte for byte, with
// every worker count.
func TestGoldenMMProjF16(t *testing.T) {
	if got := fileSHA(t, vlMMProj); got != vlMMProjSHA {
		t.Fatalf("testdata golden sha256 %s, PROVENANCE says %s", got, vlMMProjSHA)
	}
	want, err := os.ReadFile(vlMMProj)
	if err != nil {
		t.Fatal(err)
	}
	for _, jobs := range []int{1, 3} {
		_, p, err := planMMProj(t, vlDir, Options{OutType: OutF16})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Warnings) != 0 {
			t.Errorf("warnings %q", p.Warnings)
		}
		out := filepath.Join(t.TempDir(), "mmproj.gguf")
		if err := Write(context.Background(), p, out, WriteOptions{Jobs: jobs, ChunkElems: 1000}); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			i := 0
			for i < len(got) && i < len(want) && got[i] == want[i] {
				i++
			}
			t.Fatalf("jobs %d: %d bytes, reference %d; first difference at byte %d", jobs, len(got), len(want), i)
		}
		if err := ggufcheck.Check(out); err != nil {
			t.Fatalf("gguf-parser-go cross-check: %v", err)
		}
		if name := p.DefaultFileName(false); name != "mmproj-Base-F16.gguf" {
			t.Errorf("default file name %q", name)
		}
	}
}

// readF32 decodes tensor name of f to float32.
func readF32(t *testing.T, f *gguf.File, name string) ([]float32, quant.Type) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("%s: no tensor %s", f.Path, name)
	}
	raw := make([]byte, ti.Size())
	if _, err := f.Section(ti).ReadAt(raw, 0); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, ti.NumElements())
	if err := quant.Decode(ti.Type, out, raw); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out, ti.Type
}

// TestMMProjOutTypes: what the converter writes for the other --outtype
// values (MmprojModel.tensor_force_quant: the patch embedding is F16 only in
// an f16 file, F32 in every other; ModelBase.prepare_tensors: 1-D tensors
// and v.position_embd stay F32; the other matrices take the type). Against
// the golden F16 file: the same KVs but general.file_type, the same tensor
// names, order and dims, and values that round to the golden's F16 (exactly
// for f32, bf16 and auto, within a Q8_0 step for q8_0).
func TestMMProjOutTypes(t *testing.T) {
	golden := openGGUF(t, vlMMProj)
	for _, c := range []struct {
		ot       OutType
		fileType uint32
		matrix   quant.Type // the 2-D weights'
		patch    quant.Type
	}{
		{OutF32, 0, quant.F32, quant.F32},
		{OutBF16, 32, quant.BF16, quant.F32},
		{OutAuto, 32, quant.BF16, quant.F32}, // a bf16 checkpoint
		{OutQ8_0, 7, quant.Q8_0, quant.F32},
	} {
		t.Run(string(c.ot), func(t *testing.T) {
			_, p, err := planMMProj(t, vlDir, Options{OutType: c.ot})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "mmproj.gguf")
			if err := Write(context.Background(), p, out, WriteOptions{Jobs: 2}); err != nil {
				t.Fatal(err)
			}
			if err := ggufcheck.Check(out); err != nil {
				t.Fatalf("gguf-parser-go cross-check: %v", err)
			}
			f := openGGUF(t, out)
			if len(f.KVs) != len(golden.KVs) {
				t.Fatalf("%d KVs, golden %d", len(f.KVs), len(golden.KVs))
			}
			for i, kv := range f.KVs {
				g := golden.KVs[i]
				want := g.Value
				if kv.Key == "general.file_type" {
					want = c.fileType
				}
				if kv.Key != g.Key || kv.Type != g.Type || fmt.Sprint(kv.Value) != fmt.Sprint(want) {
					t.Errorf("KV %d: %s %s %v, want %s %s %v", i, kv.Key, kv.Type, kv.Value, g.Key, g.Type, want)
				}
			}
			if len(f.Tensors) != len(golden.Tensors) {
				t.Fatalf("%d tensors, golden %d", len(f.Tensors), len(golden.Tensors))
			}
			for i, ti := range f.Tensors {
				g := golden.Tensors[i]
				if ti.Name != g.Name || fmt.Sprint(ti.Dims) != fmt.Sprint(g.Dims) {
					t.Errorf("tensor %d: %s %v, golden %s %v", i, ti.Name, ti.Dims, g.Name, g.Dims)
					continue
				}
				want := g.Type // F32 in the golden stays F32
				switch {
				case strings.HasPrefix(ti.Name, "v.patch_embd.weight"):
					want = c.patch
				case g.Type == quant.F16:
					want = c.matrix
				}
				if ti.Type != want {
					t.Errorf("%s: %s, want %s", ti.Name, ti.Type, want)
				}
				got, _ := readF32(t, f, ti.Name)
				ref, _ := readF32(t, golden, g.Name)
				for k := range got {
					v := got[k]
					if g.Type == quant.F16 && ti.Type != quant.Q8_0 {
						v = tensor.F16ToFloat32(tensor.Float32ToF16(v))
					}
					tol := float32(0)
					if ti.Type == quant.Q8_0 { // a step of the block's scale max|x|/127, and F16 rounding
						b := k / 32 * 32
						for _, x := range ref[b : b+32] {
							tol = max(tol, x, -x)
						}
						tol = tol/127 + 1e-5
					}
					if d := v - ref[k]; d > tol || d < -tol {
						t.Fatalf("%s[%d] = %g, golden %g", ti.Name, k, got[k], ref[k])
					}
				}
			}
		})
	}
}

// copyVL copies the vision checkpoint to a temporary directory named base,
// leaving out the files in drop.
func copyVL(t *testing.T, drop ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "base")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(vlDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if slices.Contains(drop, e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(vlDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestMMProjBadInput: the refusals, each before a byte is written, each a
// bad-input error naming the file.
func TestMMProjBadInput(t *testing.T) {
	noPre := copyVL(t, "preprocessor_config.json")
	badPre := copyVL(t)
	if err := os.WriteFile(filepath.Join(badPre, "preprocessor_config.json"), []byte(`{"image_mean": [0.5, 1, 0.5], "image_std": [0.5, 0.5, 0.5]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dir string
		opts      Options
		sentinel  error
		want      []string
	}{
		{"text-only checkpoint", qwen35Dir, Options{}, ErrNoVision,
			[]string{qwen35Dir + " has no vision tower", `"Qwen3_5ForCausalLM"`, "text-only"}},
		{"no preprocessor_config.json", noPre, Options{}, ErrPreprocessor,
			[]string{filepath.Join(noPre, "preprocessor_config.json"), "KeyError: 'image_mean'", "Copy preprocessor_config.json from the base model"}},
		{"mixed int and float image_mean", badPre, Options{}, ErrPreprocessor,
			[]string{"mixes integers and floats"}},
		{"--no-mtp", vlDir, Options{NoMTP: true}, ErrOptions, []string{"do not apply to --mmproj"}},
		{"--pre", vlDir, Options{Pre: "qwen2"}, ErrOptions, []string{"no tokenizer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := planMMProj(t, c.dir, c.opts)
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("error %v, want %v", err, c.sentinel)
			}
			var ie *Error
			if !errors.As(err, &ie) {
				t.Fatalf("%T is not an input error", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestMMProjProcessorConfig: without preprocessor_config.json the image
// mean and std come from processor_config.json's image_processor, as
// MmprojModel merges it; the same values give the golden file.
func TestMMProjProcessorConfig(t *testing.T) {
	dir := copyVL(t, "preprocessor_config.json")
	pc := `{"processor_class": "Qwen3VLProcessor", "image_processor": {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}}`
	if err := os.WriteFile(filepath.Join(dir, "processor_config.json"), []byte(pc), 0o644); err != nil {
		t.Fatal(err)
	}
	_, p, err := planMMProj(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "m.gguf")
	if err := Write(context.Background(), p, out, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := fileSHA(t, out); got != vlMMProjSHA {
		t.Errorf("sha256 %s, golden %s", got, vlMMProjSHA)
	}
}

// TestMMProjVisionDefaults: a vision_config key the file leaves out takes
// transformers' Qwen3_5VisionConfig default, with a warning naming it (the
// converter reads the config through AutoConfig).
func TestMMProjVisionDefaults(t *testing.T) {
	dir := copyVL(t)
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg = bytes.Replace(cfg, []byte(`"num_position_embeddings": 64,`), nil, 1)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	_, p, err := planMMProj(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Warnings) != 1 || !strings.Contains(p.Warnings[0], "no num_position_embeddings: using 2304") {
		t.Errorf("warnings %q", p.Warnings)
	}
	for _, kv := range p.KVs {
		if kv.Key == "clip.vision.image_size" && kv.Value != uint32(768) { // √2304 × 16
			t.Errorf("image_size %v", kv.Value)
		}
	}
}

// TestMMProjGenerated: testmodel's vision towers (Qwen3.5 dense and MoE
// layouts) convert to an mmproj with every tensor of the tower, and the
// text conversion of the same checkpoint drops the tower silently, as the
// converter's TextModel.filter_tensors does.
func TestMMProjGenerated(t *testing.T) {
	for _, c := range []struct {
		name string
		opts interface {
			Write(string) (*testmodel.Model, error)
		}
	}{
		{"qwen35", testmodel.Qwen35Options{ConditionalGeneration: true, Vision: &testmodel.Vision{Depth: 3}}},
		{"qwen35moe", testmodel.Qwen35MoEOptions{ConditionalGeneration: true, Vision: &testmodel.Vision{Depth: 3}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), c.name)
			mod, err := c.opts.Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			ck, p, err := planMMProj(t, dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !HasVisionTower(ck) {
				t.Error("HasVisionTower false")
			}
			visual := 0
			for _, n := range mod.Names() {
				if strings.HasPrefix(n, "model.visual.") {
					visual++
				}
			}
			// 12 per block + patch (2) + pos (1) + merger (6); the
			// patch kernel becomes two tensors.
			if visual != 12*3+9 || len(p.Tensors) != visual+1 {
				t.Errorf("%d visual tensors, %d planned", visual, len(p.Tensors))
			}
			out := filepath.Join(t.TempDir(), "m.gguf")
			if err := Write(context.Background(), p, out, WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			f := openGGUF(t, out)
			if kv, _ := f.KV("clip.vision.block_count"); kv.Value != uint32(3) {
				t.Errorf("block_count %v", kv.Value)
			}
			text, err := NewPlan(ck, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tp := range text.Tensors {
				if strings.HasPrefix(tp.Name, "v.") || strings.HasPrefix(tp.Name, "mm.") || strings.Contains(strings.Join(tp.Sources, ","), "visual") {
					t.Errorf("text GGUF holds %s", tp.Name)
				}
			}
		})
	}
	// A checkpoint without a tower has none.
	ck, err := safetensors.OpenDir(qwen35Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if HasVisionTower(ck) {
		t.Error("the text-only example has a vision tower?")
	}
}
