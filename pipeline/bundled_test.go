package pipeline_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// demoSpec copies pipelines/demo.yaml into dir with its ../testdata paths
// made absolute, so it runs against the bundled example without writing
// into the repository.
func demoSpec(tb testing.TB, dir string) *Spec {
	tb.Helper()
	b, err := os.ReadFile("../pipelines/demo.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	td, err := filepath.Abs("../testdata")
	if err != nil {
		tb.Fatal(err)
	}
	src := strings.ReplaceAll(string(b), "../testdata/", td+"/")
	p := filepath.Join(dir, "demo.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		tb.Fatal(err)
	}
	s, err := Load(p)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestBundledDemo(t *testing.T) {
	spec := demoSpec(t, t.TempDir())
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if s.Action != ActionRun || len(s.Outputs) == 0 {
			t.Errorf("first run: %+v", s)
		}
	}
	rep, err = Run(context.Background(), spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if s.Action != ActionSkip {
			t.Errorf("second run: %s %s: %s", s.Stage, s.Action, s.Reason)
		}
	}
	st, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Stages {
		if s.State != StateComplete || s.Detail != "" {
			t.Errorf("status %s: %s %s", s.Stage, s.State, s.Detail)
		}
	}
}

// jarvis2.yaml parses, and plan names every stage kind that is not built
// yet instead of failing. (Its imports name a user's models, which are not
// here: plan refuses those, and says why.)
func TestBundledJarvis2(t *testing.T) {
	b, err := os.ReadFile("../pipelines/jarvis2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "jarvis2.yaml")
	os.WriteFile(p, b, 0o644)
	spec, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Plan(spec, Options{})
	if rep == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		k, _ := spec.Kinds.Lookup(s.Kind)
		switch {
		case s.Action == ActionInvalid && (s.Kind != "import" || !strings.Contains(s.Error, "no such file")):
			t.Errorf("%s (%s): invalid: %s", s.Stage, s.Kind, s.Error)
		case !k.Built() && (s.Action != ActionNotBuilt || !strings.Contains(s.Reason, "not built yet")):
			t.Errorf("%s (%s, not built): %s %s", s.Stage, s.Kind, s.Action, s.Reason)
		case k.Built() && s.Action == ActionNotBuilt:
			t.Errorf("%s (%s, built) reported not built", s.Stage, s.Kind)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".ferry")); err == nil {
		t.Error("plan created the store")
	}
}

// BenchmarkDemoNoopRerun: a second run of the finished demo pipeline does
// no work. Reports seconds per stage (the acceptance bound is 1 s) and the
// ratio to the first, full run measured in the same process (the anchor).
func BenchmarkDemoNoopRerun(b *testing.B) {
	spec := demoSpec(b, b.TempDir())
	start := time.Now()
	if _, err := Run(context.Background(), spec, Options{}); err != nil {
		b.Fatal(err)
	}
	full := time.Since(start)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rep, err := Run(context.Background(), spec, Options{})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range rep.Stages {
			if s.Action != ActionSkip {
				b.Fatalf("stage %s: %s (%s)", s.Stage, s.Action, s.Reason)
			}
		}
	}
	b.StopTimer()
	per := b.Elapsed().Seconds() / float64(b.N)
	stages := float64(len(spec.Stages))
	b.ReportMetric(per/stages, "s/stage")
	b.ReportMetric(per/full.Seconds(), "x_full_run")
	if per/stages >= 1 {
		b.Errorf("no-op re-run takes %.3f s per stage, want < 1 s", per/stages)
	}
}

// README.md says what `make demo-full` runs: every Go test that its
// Makefile recipe and pipelines/demo-full.sh run (go test -run
// '^TestName$') is named in the README's paragraph on make demo-full.
func TestREADMENamesDemoFullTests(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mk, script, readme := read("../Makefile"), read("../pipelines/demo-full.sh"), read("../README.md")
	// The recipe: the tab-indented lines after the target.
	var recipe strings.Builder
	if i := strings.Index(mk, "\ndemo-full:"); i >= 0 {
		for _, l := range strings.Split(mk[i+1:], "\n")[1:] {
			if !strings.HasPrefix(l, "\t") {
				break
			}
			recipe.WriteString(l + "\n")
		}
	}
	tests := regexp.MustCompile(`-run '\^(Test\w+)\$+'`).FindAllStringSubmatch(recipe.String()+script, -1) // $$ in make
	if len(tests) < 2 {
		t.Fatalf("found %d go tests in make demo-full's recipe and pipelines/demo-full.sh, want the two it runs: %q", len(tests), tests)
	}
	i := strings.Index(readme, "\n`make demo-full` is")
	if i < 0 {
		t.Fatal("README.md has no paragraph beginning \"`make demo-full` is\"")
	}
	para := readme[i+1:]
	if j := strings.Index(para, "\n\n"); j >= 0 {
		para = para[:j]
	}
	for _, m := range tests {
		if !strings.Contains(para, "`"+m[1]+"`") {
			t.Errorf("README.md's paragraph on make demo-full does not name %s, which it runs:\n%s", m[1], para)
		}
	}
}
