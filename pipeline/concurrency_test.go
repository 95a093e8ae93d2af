package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"
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

// Independent stages run at the same time (up to Jobs); a stage starts only
// once every stage it reads has finished; Jobs 1 runs one stage at a time.
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
		if _, err := Run(context.Background(), spec, Options{Jobs: tc.jobs, Progress: tr.progress}); err != nil {
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
