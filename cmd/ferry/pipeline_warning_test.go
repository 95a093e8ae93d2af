package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/pipeline"
)

// A warning a stage logs (a transfer finds a file at its destination that
// it did not put there) stays a log line on stderr, and is a warning event
// under --events and a line of the stage's report under --events and
// --json.
func TestPipelineRunWarning(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"model/a.bin":                "weights",
		"backup/model/old-Q6_K.gguf": "an older quant",
		"p.yaml": "name: w\nstages:\n  - name: model\n    import: { path: model }\n" +
			"  - name: shipped\n    transfer: { from: [model], to: [backup], skip_netcheck: true }\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const msg = "that the stage did not put there (delete_extra: true removes them)"
	want := "transfer: 1 files at " + filepath.Join(dir, "backup") + " " + msg + " files=model/old-Q6_K.gguf"
	file := filepath.Join(dir, "p.yaml")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"--events", []string{"pipeline", "run", "--events", file}},
		{"--json", []string{"pipeline", "run", "--json", "--force", "shipped", file}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := execFerry(t, nil, c.args...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			if n := strings.Count(r.stderr, msg); n != 1 || !strings.Contains(r.stderr, "level=WARN") {
				t.Errorf("the warning %d times on stderr, want one log line: %s", n, r.stderr)
			}
			var rep *pipeline.Report
			if c.name == "--json" {
				if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
					t.Fatalf("%v: %s", err, r.stdout)
				}
			} else {
				var warned []pipeline.Event
				sc := bufio.NewScanner(strings.NewReader(r.stdout))
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					var e pipeline.Event
					if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
						t.Fatalf("line %q: %v", sc.Text(), err)
					}
					switch e.Event {
					case pipeline.EventWarning:
						warned = append(warned, e)
					case pipeline.EventEnd:
						rep = e.Report
					}
				}
				if len(warned) != 1 || warned[0].Stage != "shipped" || warned[0].Kind != "transfer" || warned[0].Index != 2 ||
					warned[0].Reason != want || warned[0].Attrs["files"] != "model/old-Q6_K.gguf" {
					t.Errorf("warning events %+v, want one of stage shipped: %q", warned, want)
				}
				if !strings.Contains(r.stdout, `"event":"warning"`) {
					t.Errorf("no warning line: %s", r.stdout)
				}
			}
			if rep == nil {
				t.Fatal("no report")
			}
			for _, sr := range rep.Stages {
				if w := []string{want}; sr.Stage == "shipped" && !slices.Equal(sr.Warnings, w) || sr.Stage != "shipped" && sr.Warnings != nil {
					t.Errorf("stage %s: warnings %q", sr.Stage, sr.Warnings)
				}
			}
			if rep.Warnings != nil {
				t.Errorf("the run's warnings %q, want none", rep.Warnings)
			}
		})
	}
}
