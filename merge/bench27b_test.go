package merge

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/benchtest"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// Qwen3.5-27B layer shapes (hidden 5120, intermediate 17408; 3 Gated
// DeltaNet layers + 1 full-attention layer, as in the anchor slice of
// ../shared/notes/anchors.md but without the embeddings and MTP layer).
func qwen35Layer27B(l int) []safetensors.TensorSpec {
	const h, ff = 5120, 17408
	p := fmt.Sprintf("model.layers.%d.", l)
	bf := tensor.BF16
	s := func(n string, shape ...int64) safetensors.TensorSpec {
		return safetensors.TensorSpec{Name: p + n, DType: bf, Shape: shape}
	}
	var out []safetensors.TensorSpec
	if l%4 == 3 {
		out = append(out, s("self_attn.q_proj.weight", 12288, h), s("self_attn.k_proj.weight", 1024, h),
			s("self_attn.v_proj.weight", 1024, h), s("self_attn.o_proj.weight", h, 6144),
			s("self_attn.q_norm.weight", 256), s("self_attn.k_norm.weight", 256))
	} else {
		out = append(out, s("linear_attn.in_proj_qkv.weight", 10240, h), s("linear_attn.in_proj_z.weight", 6144, h),
			s("linear_attn.in_proj_b.weight", 48, h), s("linear_attn.in_proj_a.weight", 48, h),
			s("linear_attn.out_proj.weight", h, 6144), s("linear_attn.conv1d.weight", 10240, 1, 4),
			safetensors.TensorSpec{Name: p + "linear_attn.A_log", DType: tensor.F32, Shape: []int64{48}},
			s("linear_attn.dt_bias", 48), s("linear_attn.norm.weight", 128))
	}
	return append(out, s("mlp.gate_proj.weight", ff, h), s("mlp.up_proj.weight", ff, h), s("mlp.down_proj.weight", h, ff),
		s("input_layernorm.weight", h), s("post_attention_layernorm.weight", h))
}

// writeStreaming writes a tensor's random values in 1 Mi-element chunks,
// never holding the tensor.
func writeStreaming(w *safetensors.Writer, spec safetensors.TensorSpec, seed uint64) error {
	r := rng(seed*0x9e3779b97f4a7c15 + 1)
	n, _ := tensor.NumElements(spec.Shape)
	vals := make([]float32, 1<<20)
	buf := make([]byte, len(vals)*spec.DType.Bits()/8)
	for n > 0 {
		k := min(n, int64(len(vals)))
		for i := range vals[:k] {
			vals[i] = r.uniform(0.05)
		}
		b := buf[:k*int64(spec.DType.Bits()/8)]
		if err := tensor.FromF32(spec.DType, b, vals[:k]); err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// gen27B writes the benchmark checkpoint (2 GB shards) and a DoRA r=16
// adapter on all 31 projections.
func gen27B(b *testing.B, dir string, layers int) (string, string) {
	base, ad := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	if _, err := os.Stat(filepath.Join(base, safetensors.IndexName)); err == nil {
		return base, ad // kept from an earlier run (FERRY_BENCH_DIR)
	}
	var specs []safetensors.TensorSpec
	for l := 0; l < layers; l++ {
		specs = append(specs, qwen35Layer27B(l)...)
	}
	os.MkdirAll(base, 0o755)
	shards := safetensors.PlanShards(specs, 2_000_000_000)
	wm := map[string]string{}
	var total int64
	seed := uint64(0)
	var ats []genTensor
	for i, sh := range shards {
		name := safetensors.ShardName(i+1, len(shards))
		w, err := safetensors.Create(filepath.Join(base, name), map[string]string{"format": "pt"}, sh)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range sh {
			seed++
			if err := writeStreaming(w, s, seed); err != nil {
				b.Fatal(err)
			}
			wm[s.Name] = name
			total += s.Size()
			if len(s.Shape) == 2 && s.Shape[1] >= 5120 && s.Name[len(s.Name)-7:] == ".weight" {
				m := prefix + s.Name[:len(s.Name)-len(".weight")]
				ats = append(ats, gen(seed+1000, m+".lora_A.weight", tensor.F32, 0.01, 16, s.Shape[1]),
					gen(seed+2000, m+".lora_B.weight", tensor.F32, 0.02, s.Shape[0], 16),
					gen(seed+3000, m+".lora_magnitude_vector", tensor.F32, 1, s.Shape[0]))
			}
		}
		if err := w.Close(); err != nil {
			b.Fatal(err)
		}
	}
	if err := safetensors.WriteIndex(base, wm, total, nil); err != nil {
		b.Fatal(err)
	}
	writeJSONFile(b, filepath.Join(base, "config.json"), map[string]any{"architectures": []string{"Qwen3_5ForCausalLM"}, "hidden_size": 5120, "intermediate_size": 17408})
	for i := range ats {
		if len(ats[i].shape) == 1 { // magnitudes: positive, near row norms
			for j := range ats[i].vals {
				ats[i].vals[j] = 1 + ats[i].vals[j]*0.05
			}
		}
	}
	writeAdapter(b, ad, map[string]any{"r": 16, "lora_alpha": 32, "use_dora": true,
		"target_modules": []string{"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "gate_proj", "up_proj", "down_proj"}}, ats)
	return base, ad
}

const benchHelperEnv = "FERRY_MERGE_BENCH_HELPER"

// TestMergeBenchHelper is the child process of BenchmarkMerge27B (so its
// peak RSS is the merge's alone). Run on its own it does nothing.
func TestMergeBenchHelper(t *testing.T) {
	if os.Getenv(benchHelperEnv) == "" {
		return
	}
	p, err := Inventory(os.Getenv("BASE"), os.Getenv("ADAPTER"), PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := Execute(t.Context(), p, os.Getenv("OUT"), ExecOptions{}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkMerge27B merges DoRA r=16 on all projections of a ≥ 3 GB
// checkpoint with Qwen3.5-27B layer shapes in a child process, with the
// default worker count, and reports base MB/s, the child's peak RSS, the
// effective B·A GFLOP/s and the projected time for a 54 GB checkpoint.
// Set FERRY_BENCH_DIR to keep the generated checkpoint between runs.
func BenchmarkMerge27B(b *testing.B) {
	dir := os.Getenv(benchtest.DirEnv)
	if dir == "" {
		dir = b.TempDir()
	}
	base, ad := gen27B(b, dir, 4)
	p, err := Inventory(base, ad, PlanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var flops float64
	for _, m := range p.Modules {
		flops += 2 * float64(m.Rows) * float64(m.Cols) * float64(m.Rank)
	}
	total := p.TotalBytes
	nmods := len(p.Modules)
	p.Close()
	b.SetBytes(total)
	b.ResetTimer()
	var wall time.Duration
	var rss int64
	var cpu time.Duration
	for i := 0; i < b.N; i++ {
		out := filepath.Join(dir, fmt.Sprint("out", i))
		os.RemoveAll(out)
		// The child's PASS line, on its stdout, would split ours: benchtest.Run discards it.
		m := benchtest.Run(b, []string{benchHelperEnv + "=1", "BASE=" + base, "ADAPTER=" + ad, "OUT=" + out},
			os.Args[0], "-test.run=^TestMergeBenchHelper$", "-test.count=1")
		wall += m.Wall
		rss = max(rss, m.PeakRSS)
		cpu += m.CPU
		b.StopTimer()
		os.RemoveAll(out)
		b.StartTimer()
	}
	sec := wall.Seconds() / float64(b.N)
	mbs := float64(total) / 1e6 / sec
	b.ReportMetric(mbs, "base_MB/s")
	b.ReportMetric(float64(rss)/(1<<20), "peak_RSS_MiB")
	b.ReportMetric(flops/sec/1e9, "effective_BA_GFLOP/s")
	b.ReportMetric(54e9/1e6/mbs, "projected_54GB_s")
	// On a shared machine the wall clock depends on the other load; the
	// CPU time the merge used does not.
	cpuSec := cpu.Seconds() / float64(b.N)
	b.ReportMetric(cpuSec, "cpu_s")
	b.ReportMetric(float64(total)/1e6/cpuSec, "base_MB/cpu_s")
	// Anchor (../shared/notes/anchors.md): PEFT, 2 threads, 8.99 GB slice in
	// 42.506 s = 211.4 MB/s, 11.508 GiB peak RSS (a 16-vCPU Xeon, not this
	// machine: compare ratios with care).
	b.ReportMetric(mbs/211.4, "x_PEFT2thread_MB/s")
	b.Logf("%d modules, %.2f GB base, %.1f s per merge (%.1f CPU s), %d CPUs, jobs default", nmods, float64(total)/1e9, sec, cpuSec, runtime.NumCPU())
}
