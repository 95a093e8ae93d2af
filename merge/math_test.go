package merge

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// A tiny generated model: hidden 32, vocab 40, 2 layers, a Conv1D-style
// (in,out) c_fc for fan_in_fan_out, biases on q/k, and an mtp.* tensor.
const (
	hid   = 32
	inter = 48
	vocab = 40
)

func genBase(t testing.TB, dir, prefix string, dt tensor.DType) map[string]genTensor {
	var g [2][]genTensor
	all := map[string]genTensor{}
	seed := uint64(1)
	add := func(shard int, name string, a float64, shape ...int64) {
		seed++
		x := gen(seed, name, dt, a, shape...)
		g[shard] = append(g[shard], x)
		all[name] = x
	}
	add(0, prefix+"embed_tokens.weight", 1, vocab, hid)
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("%slayers.%d.", prefix, l)
		add(l, p+"self_attn.q_proj.weight", 0.2, hid, hid)
		add(l, p+"self_attn.q_proj.bias", 0.1, hid)
		add(l, p+"self_attn.k_proj.weight", 0.2, hid/2, hid)
		add(l, p+"self_attn.k_proj.bias", 0.1, hid/2)
		add(l, p+"self_attn.v_proj.weight", 0.2, hid/2, hid)
		add(l, p+"mlp.down_proj.weight", 0.2, hid, inter)
		add(l, p+"mlp.c_fc.weight", 0.2, hid, inter) // Conv1D: stored (in, out)
		add(l, p+"input_layernorm.weight", 1, hid)
	}
	add(1, prefix+"norm.weight", 1, hid)
	add(1, "lm_head.weight", 0.2, vocab, hid)
	add(1, "mtp.fc.weight", 0.2, hid, 2*hid)
	writeBase(t, dir, g[:])
	return all
}

// modSpec is one adapted module of a generated adapter.
type modSpec struct {
	module    string // runtime module path (adapter side)
	target    string // base tensor (checkpoint side)
	embedding bool
	fifo      bool
	r         int
	scaling   float64 // what PEFT's formula gives, written out by hand
	dora      bool
	magSuffix string // "" or ".weight"
	loraBias  bool
}

type featureCase struct {
	name      string
	cfg       map[string]any
	prefix    string // base layout prefix: "model." or "model.language_model."
	baseDType tensor.DType
	mods      []modSpec
	extra     func(base map[string]genTensor) []genTensor // replacement tensors
	replaced  map[string]string                           // base tensor → adapter key
	biasOf    map[string]string                           // module → base bias for lora_B.bias
}

func featureCases() []featureCase {
	m := "model.layers."
	return []featureCase{
		{name: "lora", cfg: map[string]any{"target_modules": []string{"q_proj", "v_proj"}, "r": 4, "lora_alpha": 8},
			mods: []modSpec{
				{module: m + "0.self_attn.q_proj", r: 4, scaling: 2}, {module: m + "1.self_attn.q_proj", r: 4, scaling: 2},
				{module: m + "0.self_attn.v_proj", r: 4, scaling: 2}, {module: m + "1.self_attn.v_proj", r: 4, scaling: 2}}},
		{name: "rslora", cfg: map[string]any{"target_modules": []string{"down_proj"}, "r": 3, "lora_alpha": 5, "use_rslora": true},
			mods: []modSpec{{module: m + "0.mlp.down_proj", r: 3, scaling: 5 / math.Sqrt(3)}, {module: m + "1.mlp.down_proj", r: 3, scaling: 5 / math.Sqrt(3)}}},
		{name: "rank-alpha-pattern", cfg: map[string]any{"target_modules": []string{"q_proj", "k_proj", "down_proj"}, "r": 4, "lora_alpha": 8,
			"rank_pattern":  map[string]any{"layers.1.self_attn.q_proj": 2, "k_proj": 6},
			"alpha_pattern": map[string]any{"down_proj": 3, "q_proj": 7}},
			mods: []modSpec{
				{module: m + "0.self_attn.q_proj", r: 4, scaling: 7.0 / 4}, {module: m + "1.self_attn.q_proj", r: 2, scaling: 7.0 / 2},
				{module: m + "0.self_attn.k_proj", r: 6, scaling: 8.0 / 6}, {module: m + "0.mlp.down_proj", r: 4, scaling: 3.0 / 4}}},
		{name: "regex-targets", cfg: map[string]any{"target_modules": `.*layers\.1\.self_attn\.(q|k)_proj`, "r": 2, "lora_alpha": 2},
			mods: []modSpec{{module: m + "1.self_attn.q_proj", r: 2, scaling: 1}, {module: m + "1.self_attn.k_proj", r: 2, scaling: 1}}},
		{name: "layers-to-transform", cfg: map[string]any{"target_modules": []string{"v_proj"}, "layers_to_transform": []int{1}, "layers_pattern": "layers", "r": 4, "lora_alpha": 4},
			mods: []modSpec{{module: m + "1.self_attn.v_proj", r: 4, scaling: 1}}},
		{name: "fan-in-fan-out", cfg: map[string]any{"target_modules": []string{"c_fc"}, "fan_in_fan_out": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "0.mlp.c_fc", fifo: true, r: 4, scaling: 2}, {module: m + "1.mlp.c_fc", fifo: true, r: 4, scaling: 2}}},
		{name: "fan-in-fan-out-dora", cfg: map[string]any{"target_modules": []string{"c_fc"}, "fan_in_fan_out": true, "use_dora": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "0.mlp.c_fc", fifo: true, r: 4, scaling: 2, dora: true}}},
		{name: "dora-magnitude-weight-suffix", cfg: map[string]any{"target_modules": []string{"q_proj", "down_proj"}, "use_dora": true, "r": 4, "lora_alpha": 16},
			mods: []modSpec{{module: m + "0.self_attn.q_proj", r: 4, scaling: 4, dora: true, magSuffix: ".weight"}, {module: m + "1.mlp.down_proj", r: 4, scaling: 4, dora: true}}},
		{name: "embedding-lora", cfg: map[string]any{"target_modules": []string{"embed_tokens"}, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: "model.embed_tokens", embedding: true, r: 4, scaling: 2}}},
		{name: "embedding-dora", cfg: map[string]any{"target_modules": []string{"embed_tokens", "q_proj"}, "use_dora": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: "model.embed_tokens", embedding: true, r: 4, scaling: 2, dora: true}, {module: m + "0.self_attn.q_proj", r: 4, scaling: 2, dora: true}}},
		{name: "lora-bias", cfg: map[string]any{"target_modules": []string{"q_proj"}, "lora_bias": true, "r": 4, "lora_alpha": 8},
			mods:   []modSpec{{module: m + "0.self_attn.q_proj", r: 4, scaling: 2, loraBias: true}},
			biasOf: map[string]string{m + "0.self_attn.q_proj": m + "0.self_attn.q_proj.bias"}},
		{name: "modules-to-save-and-trained-bias", cfg: map[string]any{"target_modules": []string{"k_proj"}, "modules_to_save": []string{"lm_head"}, "bias": "lora_only", "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "1.self_attn.k_proj", r: 4, scaling: 2}},
			extra: func(b map[string]genTensor) []genTensor {
				return []genTensor{
					gen(900, prefix+"lm_head.weight", tensor.F32, 0.3, vocab, hid),
					gen(901, prefix+m+"1.self_attn.k_proj.base_layer.bias", tensor.F32, 0.3, hid/2),
				}
			},
			replaced: map[string]string{"lm_head.weight": prefix + "lm_head.weight", m + "1.self_attn.k_proj.bias": prefix + m + "1.self_attn.k_proj.base_layer.bias"}},
		{name: "vlm-layout", prefix: "model.language_model.", cfg: map[string]any{"target_modules": []string{"q_proj"}, "use_dora": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{
				{module: m + "0.self_attn.q_proj", target: "model.language_model.layers.0.self_attn.q_proj.weight", r: 4, scaling: 2, dora: true},
				{module: m + "1.self_attn.q_proj", target: "model.language_model.layers.1.self_attn.q_proj.weight", r: 4, scaling: 2, dora: true}}},
		{name: "f16-base", baseDType: tensor.F16, cfg: map[string]any{"target_modules": []string{"q_proj"}, "use_dora": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "0.self_attn.q_proj", r: 4, scaling: 2, dora: true}}},
		// PEFT decides fan_in_fan_out by the layer class: Linear layers
		// (stored [out, in]; q_proj square, down_proj not) are merged
		// without it whatever the config says, Conv1D layers with it.
		{name: "fan-in-fan-out-set-on-linear", cfg: map[string]any{"target_modules": []string{"q_proj", "down_proj"}, "fan_in_fan_out": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "0.self_attn.q_proj", r: 4, scaling: 2}, {module: m + "1.mlp.down_proj", r: 4, scaling: 2}}},
		{name: "fan-in-fan-out-set-on-linear-dora", cfg: map[string]any{"target_modules": []string{"q_proj", "down_proj"}, "fan_in_fan_out": true, "use_dora": true, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "1.self_attn.q_proj", r: 4, scaling: 2, dora: true}, {module: m + "0.mlp.down_proj", r: 4, scaling: 2, dora: true}}},
		{name: "fan-in-fan-out-unset-on-conv1d", cfg: map[string]any{"target_modules": []string{"c_fc", "v_proj"}, "fan_in_fan_out": false, "r": 4, "lora_alpha": 8},
			mods: []modSpec{{module: m + "0.mlp.c_fc", fifo: true, r: 4, scaling: 2}, {module: m + "1.self_attn.v_proj", r: 4, scaling: 2}}},
	}
}

// buildCase writes base and adapter; it returns the base tensors, the
// adapter tensors and the float64 references of the merged modules.
func buildCase(t testing.TB, dir string, fc featureCase) (baseDir, adapterDir string, base map[string]genTensor, refs map[string]refLoRA, ad map[string]genTensor) {
	baseDir, adapterDir = filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	pfx := fc.prefix
	if pfx == "" {
		pfx = "model."
	}
	dt := fc.baseDType
	if dt == "" {
		dt = tensor.BF16
	}
	base = genBase(t, baseDir, pfx, dt)
	refs = map[string]refLoRA{}
	ad = map[string]genTensor{}
	var ts []genTensor
	for i, ms := range fc.mods {
		target := ms.target
		if target == "" {
			target = ms.module + ".weight"
		}
		w := base[target]
		rows, cols := int(w.shape[0]), int(w.shape[1])
		inDim, outDim := cols, rows
		if ms.embedding || ms.fifo {
			inDim, outDim = rows, cols
		}
		seed := uint64(100 + 10*i)
		k := prefix + ms.module
		var a, b genTensor
		if ms.embedding {
			a = gen(seed, k+".lora_embedding_A", tensor.F32, 0.5, int64(ms.r), int64(inDim))
			b = gen(seed+1, k+".lora_embedding_B", tensor.F32, 0.5, int64(outDim), int64(ms.r))
		} else {
			a = gen(seed, k+".lora_A.weight", tensor.F32, 0.5, int64(ms.r), int64(inDim))
			b = gen(seed+1, k+".lora_B.weight", tensor.F32, 0.1, int64(outDim), int64(ms.r))
		}
		ts = append(ts, a, b)
		ref := refLoRA{w: w.vals, rows: rows, cols: cols, a: a.vals, b: b.vals, r: ms.r, s: ms.scaling, embedding: ms.embedding, fanInFanOut: ms.fifo}
		if ms.dora {
			mag := gen(seed+2, k+".lora_magnitude_vector"+ms.magSuffix, tensor.F32, 1, int64(outDim))
			for j := range mag.vals {
				mag.vals[j] = float32(math.Abs(float64(mag.vals[j]))) + 0.5
			}
			ts = append(ts, mag)
			ref.mag = mag.vals
		}
		if ms.loraBias {
			ts = append(ts, gen(seed+3, k+".lora_B.bias", tensor.F32, 0.2, int64(outDim)))
		}
		refs[target] = ref
	}
	if fc.extra != nil {
		ts = append(ts, fc.extra(base)...)
	}
	for _, x := range ts {
		ad[x.name] = x
	}
	writeAdapter(t, adapterDir, fc.cfg, ts)
	return
}

// TestFeatures checks each adapter feature against a straightforward
// float64 merge, in float32 output (tight) and in the base dtype (within
// one ulp, nearly always identical), and that untouched tensors are copied
// byte for byte.
func TestFeatures(t *testing.T) {
	for _, fc := range featureCases() {
		t.Run(fc.name, func(t *testing.T) {
			dir := t.TempDir()
			baseDir, adapterDir, base, refs, ad := buildCase(t, dir, fc)
			p, err := Inventory(baseDir, adapterDir, PlanOptions{})
			if err != nil {
				t.Fatalf("Inventory: %v", err)
			}
			defer p.Close()
			if len(p.Modules) != len(fc.mods) {
				t.Fatalf("plan has %d modules, want %d", len(p.Modules), len(fc.mods))
			}
			for _, pm := range p.Modules {
				ref, ok := refs[pm.Target]
				if !ok {
					t.Fatalf("plan targets %s, not expected", pm.Target)
				}
				if pm.Rank != ref.r || math.Abs(pm.Scaling-ref.s) > 1e-12 {
					t.Errorf("%s: plan r=%d s=%g, want r=%d s=%g", pm.Target, pm.Rank, pm.Scaling, ref.r, ref.s)
				}
			}
			for _, dt := range []tensor.DType{tensor.F32, ""} {
				out := filepath.Join(dir, "out-"+string(dt))
				runMerge(t, baseDir, adapterDir, out, PlanOptions{DType: dt}, 3)
				c, err := safetensors.OpenDir(out)
				if err != nil {
					t.Fatal(err)
				}
				for name, ref := range refs {
					info, got := readOut(t, out, name)
					want := ref.merged()
					if ref.embedding && ref.mag == nil && dt != tensor.F32 {
						// PEFT's Embedding.merge rounds ΔW to the weight's
						// dtype first; merged into float32 (PEFT on a float32
						// copy of the base) that rounding is exact.
						want = refEmbeddingDoubleRound(ref, base[name].dtype)
					}
					if dt == tensor.F32 {
						if info.DType != tensor.F32 {
							t.Fatalf("%s: %s, want F32", name, info.DType)
						}
						closeTo(t, name, got, want, 1e-5)
						continue
					}
					bdt := base[name].dtype
					diff := 0
					for i, w := range want {
						a, b := bits16(bdt, got[i]), bits16(bdt, float32(w))
						if d := int(a) - int(b); d != 0 {
							diff++
							if d > 1 || d < -1 {
								t.Fatalf("%s[%d]: %g, float64 reference rounds to %g (more than 1 ulp)", name, i, got[i], float32(w))
							}
						}
					}
					if diff*1000 > len(want) {
						t.Errorf("%s: %d of %d elements 1 ulp off the float64 reference", name, diff, len(want))
					}
				}
				// Everything else: replacements, lora_B.bias, or the base bytes.
				for name, bt := range base {
					info, raw := readTensor(t, c, name)
					if _, ok := refs[name]; ok {
						continue
					}
					if key, ok := fc.replaced[name]; ok {
						_, got := readOut(t, out, name)
						src := ad[key]
						for i, v := range src.vals {
							if want := tensor.RoundTo(info.DType, v); got[i] != want {
								t.Fatalf("replacement %s[%d] = %g, want %g", name, i, got[i], want)
							}
						}
						continue
					}
					if isLoraBiasTarget(fc, name) {
						m := strings.TrimSuffix(name, ".bias")
						lb := ad[prefix+m+".lora_B.bias"]
						_, got := readOut(t, out, name)
						want := make([]float64, len(bt.vals))
						for i := range want {
							want[i] = float64(bt.vals[i]) + 2*float64(lb.vals[i])
						}
						tol := 1e-6
						if dt != tensor.F32 {
							tol = 1.0 / 256 // rounded to bf16: half an ulp is 2⁻⁹ relative
						}
						closeTo(t, name, got, want, tol)
						continue
					}
					if !bytes.Equal(raw, encode(t, bt)) {
						t.Errorf("untouched tensor %s is not a byte copy of the base", name)
					}
				}
				c.Close()
			}
		})
	}
}

func isLoraBiasTarget(fc featureCase, name string) bool {
	for _, b := range fc.biasOf {
		if b == name {
			return true
		}
	}
	return false
}

func refEmbeddingDoubleRound(m refLoRA, dt tensor.DType) []float64 {
	out := make([]float64, m.rows*m.cols)
	for i := 0; i < m.rows; i++ {
		for j := 0; j < m.cols; j++ {
			var d float64
			for k := 0; k < m.r; k++ {
				d += float64(m.b[j*m.r+k]) * float64(m.a[k*m.rows+i])
			}
			out[i*m.cols+j] = float64(m.w[i*m.cols+j]) + float64(tensor.RoundTo(dt, float32(m.s*d)))
		}
	}
	return out
}

func bits16(dt tensor.DType, f float32) uint16 {
	if dt == tensor.F16 {
		return tensor.Float32ToF16(f)
	}
	return tensor.Float32ToBF16(f)
}

// TestDeterministicAcrossJobs: the output bytes do not depend on the worker
// count, the row-block size or how many shards are written at once (a
// six-shard base too).
func TestDeterministicAcrossJobs(t *testing.T) {
	fc := featureCases()[9] // embedding DoRA + q_proj DoRA: both norm directions
	dir := t.TempDir()
	baseDir, adapterDir, _, _, _ := buildCase(t, dir, fc)
	multiBase, multiAdapter := writeMultiShard(t, filepath.Join(dir, "multi"), 6, 256, 512)
	for _, in := range []struct{ base, adapter string }{{baseDir, adapterDir}, {multiBase, multiAdapter}} {
		var first []FileDigest
		for i, cfg := range []struct{ jobs, block, shards int }{{1, 0, 1}, {4, 0, 4}, {3, 64, 6}, {8, 1, 2}, {2, 0, 0}} {
			p, err := Inventory(in.base, in.adapter, PlanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := Execute(t.Context(), p, filepath.Join(t.TempDir(), fmt.Sprint("out", i)), ExecOptions{Jobs: cfg.jobs, BlockElems: cfg.block, Shards: cfg.shards})
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = res.Files
				continue
			}
			if len(res.Files) != len(first) {
				t.Fatalf("%s, %+v: %d files, want %d", in.base, cfg, len(res.Files), len(first))
			}
			for k := range first {
				if res.Files[k] != first[k] {
					t.Errorf("%s, jobs=%d block=%d shards=%d: %s differs (%s vs %s)", in.base, cfg.jobs, cfg.block, cfg.shards, res.Files[k].Name, res.Files[k].SHA256, first[k].SHA256)
				}
			}
		}
	}
}

// TestSingleFileBase: a one-file base (model.safetensors, no index) gives a
// one-file output, and the same merged bytes as the sharded layout.
func TestSingleFileBase(t *testing.T) {
	fc := featureCases()[0]
	dir := t.TempDir()
	baseDir, adapterDir, base, _, _ := buildCase(t, dir, fc)
	single := filepath.Join(dir, "single")
	var all []genTensor
	c, err := safetensors.OpenDir(baseDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range c.Tensors() {
		all = append(all, base[l.Info.Name])
	}
	c.Close()
	if err := os.MkdirAll(single, 0o755); err != nil {
		t.Fatal(err)
	}
	writeTensors(t, filepath.Join(single, safetensors.SingleName), all)
	p, res := runMerge(t, single, adapterDir, filepath.Join(dir, "out"), PlanOptions{}, 2)
	if !p.Single || len(res.Files) != 1 || res.Files[0].Name != safetensors.SingleName {
		t.Fatalf("single-file base gave %+v", res.Files)
	}
	runMerge(t, baseDir, adapterDir, filepath.Join(dir, "out-sharded"), PlanOptions{}, 2)
	for name := range base {
		_, a := readOut(t, filepath.Join(dir, "out"), name)
		_, b := readOut(t, filepath.Join(dir, "out-sharded"), name)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				t.Fatalf("%s differs between single-file and sharded merges", name)
			}
		}
	}
}
