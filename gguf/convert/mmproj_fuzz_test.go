package convert

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

// FuzzMMProjConfig: whatever config.json and preprocessor_config.json say,
// planning the reference checkpoint's vision tower either succeeds with a
// laid-out plan or fails with an error; it never panics or allocates from
// an unchecked count (depth, deepstack indexes, image sizes, array
// lengths).
func FuzzMMProjConfig(f *testing.F) {
	cfg, err := os.ReadFile(filepath.Join(vlDir, "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	pre, err := os.ReadFile(filepath.Join(vlDir, "preprocessor_config.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cfg, pre)
	f.Add(cfg, []byte(`{"media_proc_cfg": {"image_mean": [1, 2, 3], "image_std": [true]}}`))
	f.Add([]byte(`{"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {"hidden_size": 256, "rms_norm_eps": 1e-5}, "vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 2], "image_size": 448}}`), pre)
	f.Add([]byte(`{"architectures": ["Qwen3_5ForConditionalGeneration"], "hidden_size": 8, "vision_config": {"depth": 100000000000, "num_position_embeddings": -4}}`), []byte(`{"image_mean": [], "image_std": [1e400]}`))
	ck, err := safetensors.OpenDir(vlDir)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ck.Close() })
	f.Fuzz(func(t *testing.T, cfgJSON, preJSON []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "preprocessor_config.json"), preJSON, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := safetensors.ParseConfig(cfgJSON, filepath.Join(dir, "config.json"))
		if err != nil {
			return
		}
		fc := *ck // the same shards, this config, the preprocessor file in dir
		fc.Dir, fc.Config = dir, c
		p, err := NewPlan(&fc, Options{MMProj: true})
		if err != nil {
			return
		}
		if p.Layout == nil || len(p.Tensors) == 0 || !p.MMProj {
			t.Fatalf("plan without layout or tensors: %+v", p)
		}
	})
}
