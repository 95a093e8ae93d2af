package pipeline_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline"
)

// copyDir copies the files of src into dst (flat: checkpoints are).
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dst, e.Name()), string(b))
	}
}

// A pipeline whose last stage cannot run (its planner refuses it from the
// inputs' headers and configs) fails in plan, naming the stage and why, and
// run refuses before its first stage starts: no stage ran, nothing is in
// the store.
func TestCLIPlanRefusesBeforeRunning(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) // makes dir/base and dir/adapter
		last  string
		want  string
	}{
		{"unsupported architecture", func(t *testing.T, dir string) {
			copyDir(t, models+"/base", filepath.Join(dir, "base"))
			cfg := filepath.Join(dir, "base", "config.json")
			b, _ := os.ReadFile(cfg)
			var c map[string]any
			json.Unmarshal(b, &c)
			c["architectures"] = []string{"FooForCausalLM"}
			b, _ = json.Marshal(c)
			write(t, cfg, string(b))
			copyDir(t, models+"/adapter-dora", filepath.Join(dir, "adapter"))
		}, "gguf: { from: base, outtype: q8_0 }", `architectures\[0\] is "FooForCausalLM"`},
		{"adapter for another model", func(t *testing.T, dir string) {
			if err := testmodel.CompressedQwen3(1).Write(filepath.Join(dir, "base")); err != nil {
				t.Fatal(err)
			}
			copyDir(t, models+"/adapter-dora", filepath.Join(dir, "adapter"))
		}, "merge: { base: base, adapter: adapter }", `the adapter applies to nothing in the base`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			p := filepath.Join(dir, "p.yaml")
			write(t, p, "name: r\nstages:\n  - name: base\n    import: { path: base }\n  - name: adapter\n    import: { path: adapter }\n"+
				"  - name: last\n    "+tc.last+"\n")
			r := ferry(t, "pipeline", "plan", p)
			if r.code != 2 || !regexp.MustCompile(`(?m)^\s+last\s+\S+\s+invalid\s.*`+tc.want).MatchString(r.stdout) ||
				!strings.Contains(r.stderr, "stage last: ") {
				t.Errorf("plan: exit %d, want 2 and stage last invalid (%s)\n%s%s", r.code, tc.want, r.stdout, r.stderr)
			}
			r = ferry(t, "pipeline", "run", p)
			if r.code != 2 || !strings.Contains(r.stderr, "stage last: ") || !strings.Contains(r.stderr, "nothing was run") ||
				strings.Contains(r.stderr, "stage start") {
				t.Errorf("run: exit %d, want 2, refused before any stage\n%s%s", r.code, r.stdout, r.stderr)
			}
			s, err := manifest.Load(filepath.Join(dir, ".ferry"))
			if err != nil {
				t.Fatal(err)
			}
			if recs := s.Records(); len(recs) != 0 {
				t.Errorf("a refused run ran %d stages", len(recs))
			}
			if blobs, _ := os.ReadDir(filepath.Join(dir, ".ferry", "blobs", manifest.Algorithm)); len(blobs) != 0 {
				t.Errorf("a refused run stored %d blobs", len(blobs))
			}
		})
	}
}

// A stage reading an import is planned from the import's source before
// anything runs; one reading a stage that has not run yet says when it
// will be checked.
func TestPlanChecksWhatItCan(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny")
	dir := t.TempDir()
	spec := loadSpec(t, dir, "name: c\nstages:\n"+
		"  - name: base\n    import: { path: "+models+"/base }\n"+
		"  - name: adapter\n    import: { path: "+models+"/adapter-dora }\n"+
		"  - name: merged\n    merge: { base: base, adapter: adapter }\n"+
		"  - name: f16\n    gguf: { from: merged }\n"+
		"  - name: direct\n    gguf: { from: base, outtype: bf16 }\n"+
		"  - name: check\n    verify_mtp: { from: [f16, merged] }\n"+ // no planner
		"  - name: remerge\n    merge: { base: merged, adapter: f16 }\n")
	rep, err := pipeline.Plan(spec, pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"base":    `^12 files, [0-9.]+ MB$`,
		"merged":  `^\d+ modules into 7 shards, `,
		"f16":     `^checked after merged runs$`,
		"direct":  `^Qwen3_5ForCausalLM → qwen35 \(bf16\), \d+ tensors, `,
		"check":   `^$`,
		"remerge": `^checked after merged and f16 run$`,
	}
	for _, s := range rep.Stages {
		if re, ok := want[s.Stage]; ok && !regexp.MustCompile(re).MatchString(s.Plan) {
			t.Errorf("stage %s: plan %q, want %s", s.Stage, s.Plan, re)
		}
	}
	if _, err := os.Stat(spec.Store); !os.IsNotExist(err) {
		t.Error("plan created the store")
	}
	// Once merged has run, f16 is planned from it.
	if _, err := pipeline.Run(context.Background(), spec, pipeline.Options{Only: "base"}); err != nil {
		t.Fatal(err)
	}
	for _, only := range []string{"adapter", "merged"} {
		if _, err := pipeline.Run(context.Background(), spec, pipeline.Options{Only: only}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = pipeline.Plan(spec, pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Stages[3]; s.Stage != "f16" || !strings.HasPrefix(s.Plan, "Qwen3_5ForCausalLM → qwen35 (f16)") {
		t.Errorf("f16 after merged ran: %+v", s)
	}
}

// --memory takes a size; --stages and -j bound stages and workers.
func TestCLIRunBudgetFlags(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: b\nstages:\n  - name: a\n    synth: { size: 1000, memory: 2GB }\n  - name: b\n    synth: { size: 1000, seed: 2 }\n")
	for _, bad := range []string{"lots", "0", "-5MB"} {
		if r := ferry(t, "pipeline", "run", "--memory", bad, p); r.code != 2 || !strings.Contains(r.stderr, "--memory") {
			t.Errorf("--memory %s: exit %d %s", bad, r.code, r.stderr)
		}
	}
	// a is estimated over the budget: it runs alone, and the run ends.
	if r := ferry(t, "pipeline", "run", "--memory", "1GiB", "--stages", "2", "-j", "1", p); r.code != 0 {
		t.Errorf("run within a budget: exit %d %s", r.code, r.stderr)
	}
}
