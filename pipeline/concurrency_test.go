package pipeline_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline" // an external test package: pipelinetest imports pipeline
)

// stageTracker is a Progress factory that records which stages run at the
// same time. With a barrier of n, each of the first n stages to start waits
// at its SetTotal until n stages are running (or a timeout), so a runner that ran independent
// stages one after another would show at most one running at once.
type stageTracker struct {
	mu        sync.Mutex
	running   map[string]bool
	maxActive int
	// seen[stage] = the stages running when it started (itself excluded)
	seen    map[string][]string
	barrier int
	started int
	timeout time.Duration
}

func newStageTracker(barrier int) *stageTracker {
	return &stageTracker{running: map[string]bool{}, seen: map[string][]string{},
		barrier: barrier, timeout: 5 * time.Second}
}

type trackedProgress struct {
	t     *stageTracker
	stage string
	once  sync.Once
}

func (t *stageTracker) progress(stage string) Progress { return &trackedProgress{t: t, stage: stage} }

func (p *trackedProgress) SetTotal(int64) {
	p.once.Do(func() {
		t := p.t
		t.mu.Lock()
		for s := range t.running {
			t.seen[p.stage] = append(t.seen[p.stage], s)
		}
		t.running[p.stage] = true
		t.maxActive = max(t.maxActive, len(t.running))
		t.started++
		wait := t.started <= t.barrier
		t.mu.Unlock()
		if t.barrier > 1 && wait {
			deadline := time.After(t.timeout)
			for {
				t.mu.Lock()
				n := len(t.running)
				t.mu.Unlock()
				if n >= t.barrier {
					return
				}
				select {
				case <-deadline:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}
	})
}

func (p *trackedProgress) Add(int64) {}

func (p *trackedProgress) Close() error {
	p.t.mu.Lock()
	delete(p.t.running, p.stage)
	p.t.mu.Unlock()
	return nil
}

// Independent stages run at the same time (up to Stages); a stage starts only
// once every stage it reads has finished; Stages 1 runs one stage at a time.
func TestRunIndependentStagesConcurrently(t *testing.T) {
	const src = `name: c
stages:
  - name: a
    synth: { size: 64KiB, units: 4, seed: 1 }
  - name: b
    synth: { size: 64KiB, units: 4, seed: 2 }
  - name: c
    synth: { size: 64KiB, units: 4, seed: 3, from: [a, b] }
`
	for _, tc := range []struct {
		jobs, wantMax int
	}{{2, 2}, {1, 1}} {
		spec := loadSpec(t, t.TempDir(), src)
		tr := newStageTracker(tc.jobs)
		if _, err := Run(context.Background(), spec, Options{Stages: tc.jobs, Workers: tc.jobs, Progress: tr.progress}); err != nil {
			t.Fatal(err)
		}
		if tr.maxActive != tc.wantMax {
			t.Errorf("jobs %d: at most %d stages ran at once, want %d", tc.jobs, tr.maxActive, tc.wantMax)
		}
		if len(tr.seen["c"]) != 0 {
			t.Errorf("jobs %d: stage c started while %v were still running", tc.jobs, tr.seen["c"])
		}
	}
}

// Two stages with the same key (same kind, parameters and inputs, wanted in
// two views) do not run at once on one journal: one runs, the other finds
// its record and skips, and both views read the same bytes.
func TestRunSameKeyStages(t *testing.T) {
	const src = `name: same
stages:
  - name: a
    synth: { size: 8MiB, units: 16, seed: 1 }
  - name: b
    synth: { size: 8MiB, units: 16, seed: 1 }
    out: out/b
`
	dir := t.TempDir()
	spec := loadSpec(t, dir, src)
	rep, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := actions(rep)
	if a, b := got["a"], got["b"]; !(strings.HasPrefix(a, "run") && strings.HasPrefix(b, "skip") || strings.HasPrefix(a, "skip") && strings.HasPrefix(b, "run")) {
		t.Errorf("actions %v, want one run and one skip", got)
	}
	if rep.Stages[0].Outputs[0] != rep.Stages[1].Outputs[0] {
		t.Errorf("outputs differ: %+v %+v", rep.Stages[0].Outputs, rep.Stages[1].Outputs)
	}
	for _, v := range []string{filepath.Join(spec.Store, "views", "a", "synth.bin"), filepath.Join(dir, "out", "b", "synth.bin")} {
		if d, _, err := manifest.HashFile(v); err != nil || d != rep.Stages[0].Outputs[0].Digest {
			t.Errorf("view %s: %s %v", v, d, err)
		}
	}
}

// The stages running at once keep within Options.Memory by their planners'
// estimates (synth declares its own); a stage estimated over the whole
// budget runs alone. Options.Stages stays a bound too.
func TestRunMemoryBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		memory  [4]string // of stages a, b, c, d (independent)
		budget  int64
		stages  int
		wantMax int    // 0: depends on the order the stages queue in
		alone   string // a stage nothing else may run beside
	}{
		{"all fit", [4]string{"20MB", "20MB", "20MB", "20MB"}, 100e6, 4, 4, ""},
		{"two fit", [4]string{"40MB", "40MB", "40MB", "40MB"}, 100e6, 4, 2, ""},
		{"one fits", [4]string{"60MB", "60MB", "60MB", "60MB"}, 100e6, 4, 1, ""},
		{"stages bound", [4]string{"1MB", "1MB", "1MB", "1MB"}, 100e6, 3, 3, ""},
		{"over the budget runs alone", [4]string{"20MB", "500MB", "20MB", "20MB"}, 100e6, 4, 0, "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "name: m\nstages:\n"
			names := []string{"a", "b", "c", "d"}
			for i, n := range names {
				src += fmt.Sprintf("  - name: %s\n    synth: { size: 4MiB, units: 64, seed: %d, memory: %s }\n", n, i, tc.memory[i])
			}
			spec := loadSpec(t, t.TempDir(), src)
			tr := newStageTracker(tc.wantMax)
			tr.timeout = time.Second // long enough for a runner that over-commits to show it
			if _, err := Run(context.Background(), spec, Options{Stages: tc.stages, Workers: 1, Memory: tc.budget, Progress: tr.progress}); err != nil {
				t.Fatal(err)
			}
			if tc.wantMax > 0 && tr.maxActive != tc.wantMax {
				t.Errorf("at most %d stages ran at once, want %d", tr.maxActive, tc.wantMax)
			}
			if tc.alone != "" {
				if len(tr.seen[tc.alone]) != 0 {
					t.Errorf("%s started while %v ran", tc.alone, tr.seen[tc.alone])
				}
				for _, n := range names {
					if slices.Contains(tr.seen[n], tc.alone) {
						t.Errorf("%s started while %s ran", n, tc.alone)
					}
				}
			}
		})
	}
}
