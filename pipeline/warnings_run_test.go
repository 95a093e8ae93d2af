package pipeline_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	. "github.com/ferry-llm/ferry/pipeline"
)

// What a run logs at Warn level (a stage's own warning through its
// Env.Log, the runner's about a stage, the runner's about the run) is a
// warning event, sent before the end, and a line of the report: the
// stage's, or the run's.
func TestRunWarnings(t *testing.T) {
	ctx := context.Background()
	type want struct {
		stage, kind string
		prefix      string // of the event's Reason, the report's line
		attrs       map[string]string
	}
	for _, c := range []struct {
		name string
		// setup returns the run to watch, after any run it needs first.
		setup func(t *testing.T) (*Spec, Options)
		want  func(spec *Spec) []want
	}{
		{
			name: "a stage's own: a transfer finds files it did not put there",
			setup: func(t *testing.T) (*Spec, Options) {
				dir := t.TempDir()
				writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
				writeFile(t, filepath.Join(dir, "backup", "model", "old-Q6_K.gguf"), "an older quant")
				return loadSpec(t, dir, "name: x\nstages:\n  - name: model\n    import: { path: model }\n"+
					"  - name: shipped\n    transfer: { from: [model], to: [backup], skip_netcheck: true }\n"), Options{}
			},
			want: func(spec *Spec) []want {
				return []want{{"shipped", "transfer", "transfer: 1 files at " + filepath.Join(spec.Dir, "backup") + " that the stage did not put there (delete_extra: true removes them) files=model/old-Q6_K.gguf",
					map[string]string{"files": "model/old-Q6_K.gguf"}}}
			},
		},
		{
			name: "the runner's about a stage: another machine made it with other parameters",
			setup: func(t *testing.T) (*Spec, Options) {
				shared := t.TempDir()
				spec := func(seedB int) *Spec {
					s := loadSpec(t, t.TempDir(), "name: p\nstore: file://"+shared+"\nstages:\n"+
						"  - name: a\n    synth: { size: 1MiB, units: 2, seed: 1 }\n"+
						fmt.Sprintf("  - name: b\n    synth: { size: 1MiB, units: 2, seed: %d, from: a }\n", seedB))
					s.Store = filepath.Join(t.TempDir(), "cache")
					return s
				}
				if _, err := Run(ctx, spec(2), Options{Host: "team"}); err != nil {
					t.Fatal(err)
				}
				return spec(7), Options{Host: "other"}
			},
			want: func(*Spec) []want {
				return []want{{"b", "synth", "another machine made this stage of this pipeline's name with other parameters", map[string]string{"made_on": "team"}}}
			},
		},
		{
			name: "the run's: its cache is over its bound",
			setup: func(t *testing.T) (*Spec, Options) {
				spec := loadSpec(t, t.TempDir(), "name: p\nstore: file://"+t.TempDir()+"\nstages:\n  - name: a\n    synth: { size: 1MiB, units: 2 }\n")
				spec.Store = filepath.Join(t.TempDir(), "cache")
				return spec, Options{CacheMax: 1000}
			},
			want: func(spec *Spec) []want {
				return []want{{"", "", "the cache is over its bound: what the stages' views show takes more cache=" + spec.Store + ` held="1.0 MB" bound="1.0 KB"`,
					map[string]string{"cache": spec.Store, "held": "1.0 MB", "bound": "1.0 KB"}}}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, opts := c.setup(t)
			var mu sync.Mutex
			var evs []Event
			opts.Events = func(e Event) {
				mu.Lock()
				defer mu.Unlock()
				evs = append(evs, e)
			}
			rep, err := Run(ctx, spec, opts)
			if err != nil {
				t.Fatal(err)
			}
			var warned []Event
			for _, e := range evs {
				if e.Event == EventWarning {
					warned = append(warned, e)
				}
			}
			want := c.want(spec)
			if len(warned) != len(want) {
				t.Fatalf("%d warning events, want %d: %+v", len(warned), len(want), warned)
			}
			if last := evs[len(evs)-1]; last.Event != EventEnd || last.Report != rep {
				t.Errorf("last event %+v, want the end with the report", last)
			}
			byStage := map[string][]string{}
			for i, w := range want {
				e := warned[i]
				if e.Stage != w.stage || e.Kind != w.kind || !strings.HasPrefix(e.Reason, w.prefix) || e.Time.IsZero() || e.Error != "" {
					t.Errorf("warning %d: %+v, want stage %q (%s), reason %q…", i, e, w.stage, w.kind, w.prefix)
				}
				if got := maps.Clone(e.Attrs); w.attrs != nil {
					maps.DeleteFunc(got, func(k, _ string) bool { _, ok := w.attrs[k]; return !ok })
					if !maps.Equal(got, w.attrs) {
						t.Errorf("warning %d: attrs %v, want %v among them", i, e.Attrs, w.attrs)
					}
				}
				if e.Stage != "" && (e.Index == 0 || e.Total == 0) {
					t.Errorf("warning %d of a selected stage without its step: %+v", i, e)
				}
				byStage[w.stage] = append(byStage[w.stage], e.Reason)
			}
			if !slices.Equal(rep.Warnings, byStage[""]) {
				t.Errorf("report's warnings %q, want %q", rep.Warnings, byStage[""])
			}
			for _, sr := range rep.Stages {
				if !slices.Equal(sr.Warnings, byStage[sr.Stage]) {
					t.Errorf("stage %s's warnings in the report %q, want %q", sr.Stage, sr.Warnings, byStage[sr.Stage])
				}
			}

			// Without Options.Events the report has them all the same.
			spec2, opts2 := c.setup(t)
			rep2, err := Run(ctx, spec2, opts2)
			if err != nil {
				t.Fatal(err)
			}
			n := len(rep2.Warnings)
			for _, sr := range rep2.Stages {
				n += len(sr.Warnings)
			}
			if n != len(want) {
				t.Errorf("without events: %d warnings in the report, want %d: %+v", n, len(want), rep2)
			}
		})
	}
}

// A warning about an input outside --only's selection (an import whose
// sources cannot be looked at: a symlink to a directory appeared in it) is
// given once, though both the run and its planning pass look at the input.
func TestRunOnlyWarnsOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model", "a.bin"), "weights")
	spec := loadSpec(t, dir, "name: x\nstages:\n  - name: model\n    import: { path: model }\n"+
		"  - name: b\n    synth: { size: 1MiB, units: 2, seed: 1, from: model }\n")
	if _, err := Run(ctx, spec, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "elsewhere"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "model", "d")); err != nil {
		t.Fatal(err)
	}
	var warned []Event
	rep, err := Run(ctx, spec, Options{Only: "b", Force: []string{"b"}, Events: func(e Event) {
		if e.Event == EventWarning {
			warned = append(warned, e)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(rep.Warnings)
	for _, sr := range rep.Stages {
		n += len(sr.Warnings)
	}
	if len(warned) != 1 || n != 1 {
		t.Fatalf("%d warning events and %d report lines for one condition, want 1 each: %+v", len(warned), n, warned)
	}
	// Given before the run starts, of a stage that is no step of it: no
	// index, and the run's count of steps.
	if e := warned[0]; e.Stage != "model" || e.Index != 0 || e.Total != 1 {
		t.Errorf("the warning's stage, index and total: %q %d/%d, want model 0/1", e.Stage, e.Index, e.Total)
	}
}
