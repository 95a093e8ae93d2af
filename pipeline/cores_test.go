package pipeline_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A run that shares its outputs gives each stage that runs side by side
// a hold on the cores whose priority is the bytes its plan says it will
// write (the F16 GGUF above the K-quants above the MLX folder, as their
// sizes are); an import, which says none, gets priority 0. A run on a
// local store takes no cores at all.
func TestStageCoresByOutputBytes(t *testing.T) {
	base, err := filepath.Abs("../testdata/models/qwen35-tiny/base")
	if err != nil {
		t.Fatal(err)
	}
	stages := "stages:\n" +
		"  - name: base\n    import: { path: " + base + " }\n" +
		"  - name: f16\n    gguf: { from: base, outtype: f16 }\n" +
		"  - name: quants\n    quantize: { from: base, types: [Q6_K, Q4_K_M] }\n" +
		"  - name: mlx4\n    mlx_quantize: { from: base, bits: 4, group_size: 64 }\n"
	for _, c := range []struct {
		name   string
		shared bool
	}{{"local store", false}, {"shared store", true}} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			prio, held := map[string]int64{}, map[string]bool{}
			StageCores(func(stage string, p int64, ok bool) {
				mu.Lock()
				prio[stage], held[stage] = p, ok
				mu.Unlock()
			})
			defer StageCores(nil)
			store := ".ferry"
			if c.shared {
				store = "file://" + t.TempDir()
			}
			spec := loadSpec(t, t.TempDir(), "name: p\nstore: "+store+"\n"+stages)
			if c.shared {
				spec.Store = filepath.Join(t.TempDir(), "cache")
			}
			rep, err := Run(context.Background(), spec, Options{Host: "machine-a"})
			if err != nil {
				t.Fatal(err)
			}
			written := map[string]int64{}
			for _, sr := range rep.Stages {
				if sr.Action != ActionRun {
					t.Fatalf("stage %s: %s (%s), want it run", sr.Stage, sr.Action, sr.Reason)
				}
				for _, o := range sr.Outputs {
					written[sr.Stage] += o.Size
				}
				if _, ok := held[sr.Stage]; !ok {
					t.Fatalf("stage %s ran without being told its cores", sr.Stage)
				}
			}
			if !c.shared {
				for st, ok := range held {
					if ok {
						t.Errorf("stage %s holds cores (priority %d) on a local store", st, prio[st])
					}
				}
				return
			}
			for _, st := range []string{"base", "f16", "quants", "mlx4"} {
				if !held[st] {
					t.Errorf("stage %s takes no cores in a shared run", st)
				}
			}
			if prio["base"] != 0 {
				t.Errorf("the import's priority %d, want 0", prio["base"])
			}
			// The GGUF stages write what they planned, to the byte; the
			// MLX folder's plan counts its weights (not its config and
			// tokenizer files).
			for _, st := range []string{"f16", "quants"} {
				if prio[st] != written[st] {
					t.Errorf("stage %s: priority %d, it wrote %d bytes", st, prio[st], written[st])
				}
			}
			if prio["mlx4"] <= 0 || prio["mlx4"] > written["mlx4"] {
				t.Errorf("stage mlx4: priority %d, it wrote %d bytes", prio["mlx4"], written["mlx4"])
			}
			if !(prio["f16"] > prio["quants"] && prio["quants"] > prio["mlx4"]) {
				t.Errorf("priorities f16 %d, quants %d, mlx4 %d: want the largest first", prio["f16"], prio["quants"], prio["mlx4"])
			}
		})
	}
}
