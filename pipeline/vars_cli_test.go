package pipeline_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/pipeline"
)

// --var on plan, run and status: values reach the stages, a list variable
// takes commas, and every mistake is exit 2 before anything runs.
func TestCLIVars(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "v.yaml")
	write(t, p, `name: v
vars:
  SIZE: "1000"
  SEED:
  FROM: [a]
stages:
  - name: a
    synth: { size: 10, units: 1 }
  - name: b
    synth: { size: 20, units: 1, seed: 2 }
  - name: s
    synth: { size: "${SIZE}", units: 2, seed: "${SEED}", from: ["${FROM}"] }
`)
	for _, cmd := range []string{"plan", "run", "status"} {
		r := ferry(t, "pipeline", cmd, p)
		if r.code != 2 || !strings.Contains(r.stderr, "v.yaml:12: variable ${SEED} is not set: give --var SEED=VALUE") {
			t.Errorf("%s without SEED: exit %d %q", cmd, r.code, r.stderr)
		}
		r = ferry(t, "pipeline", cmd, "--var", "SEED=1", "--var", "SEDD=2", p)
		if r.code != 2 || !strings.Contains(r.stderr, "--var SEDD: "+p+" declares no such variable (declared: FROM, SEED, SIZE)") {
			t.Errorf("%s --var SEDD: exit %d %q", cmd, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".ferry")); err == nil {
		t.Error("a bad --var created the store")
	}
	r := ferry(t, "pipeline", "plan", "--var", "SEED=7", "--var", "FROM=a,b", p)
	if r.code != 0 || !strings.Contains(r.stdout, "vars: FROM=a,b (--var), SEED=7 (--var), SIZE=1000 (default)") {
		t.Fatalf("plan: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = ferry(t, "pipeline", "run", "--json", "--var", "SEED=7", "--var", "FROM=a,b", "--var", "SIZE=3000", p)
	var rep pipeline.Report
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		t.Fatalf("run: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if s := rep.Stages[2]; s.Action != pipeline.ActionRun || len(s.Outputs) != 1 || s.Outputs[0].Size != 3000 {
		t.Errorf("s: %+v", s)
	}
	// The same values: nothing to do. Another value: s runs again.
	r = ferry(t, "pipeline", "plan", "--var", "SEED=7", "--var", "FROM=a,b", "--var", "SIZE=3000", p)
	if r.code != 0 || strings.Count(r.stdout, " skip ") != 3 {
		t.Errorf("plan after run: %q", r.stdout)
	}
	r = ferry(t, "pipeline", "plan", "--var", "SEED=8", "--var", "FROM=a,b", "--var", "SIZE=3000", p)
	if r.code != 0 || !strings.Contains(r.stdout, "parameters changed") {
		t.Errorf("plan with another seed: %q", r.stdout)
	}
	r = ferry(t, "pipeline", "plan", "--json", "--var", "SEED=8", "--var", "FROM=a,b", "--var", "SIZE=3000", p)
	rep = pipeline.Report{}
	if json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Stages[2].Cause != pipeline.CauseParams ||
		rep.Stages[2].Reason != "parameters changed: seed 7 -> 8" || rep.Stages[0].Cause != "" || len(rep.Vars) != 3 {
		t.Errorf("plan --json: %q", r.stdout)
	}
	// status: each stage's time, outputs and bytes; each output's size and digest.
	r = ferry(t, "pipeline", "status", "--var", "SEED=7", p)
	if r.code != 0 || !regexp.MustCompile(`(?m)^s \(synth\): complete, finished \S+ \S+ \(took [0-9.]+s\), 1 output, 3.0 KB$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\s+synth.bin\s+3.0 KB\s+3000\s+sha256:[0-9a-f]{64}$`).MatchString(r.stdout) {
		t.Errorf("status: %q %q", r.stdout, r.stderr)
	}
}
