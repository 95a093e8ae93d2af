package pipeline_test

import (
	"bufio"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/pipeline"
)

// runEvents runs `ferry pipeline run --events` and decodes its stdout, one
// event a line.
func runEvents(t *testing.T, args ...string) ([]pipeline.Event, int, string) {
	t.Helper()
	r := ferryEnv(t, []string{"FERRY_PROGRESS_INTERVAL=1ms"}, append([]string{"pipeline", "run", "--events"}, args...)...)
	var evs []pipeline.Event
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e pipeline.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, e)
	}
	return evs, r.code, r.stderr
}

// --events: one JSON object a line, in order: start, then per stage run,
// progress and done (or skip), and the report last; a run that stops
// before it starts still ends with an end event naming the error.
func TestCLIEvents(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "e.yaml")
	write(t, p, "name: e\nstages:\n  - name: a\n    synth: { size: 4MiB, units: 16 }\n  - name: b\n    synth: { size: 2000, units: 2, from: a }\n")
	evs, code, stderr := runEvents(t, "-j", "1", p)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var seq []string
	progressA := 0
	for _, e := range evs {
		if e.Event == pipeline.EventProgress {
			if e.Stage == "a" && e.Index == 1 && e.Total == 2 && e.Bytes > 0 && e.Of == 4<<20 {
				progressA++
			}
			continue
		}
		seq = append(seq, string(e.Event)+" "+e.Stage)
		if e.Time.IsZero() || e.Total != 2 {
			t.Errorf("event %+v", e)
		}
	}
	if got := strings.Join(seq, ","); got != "start ,run a,done a,run b,done b,end " {
		t.Errorf("events %s", got)
	}
	if progressA == 0 {
		t.Errorf("no progress event for a with its step, bytes and total: %+v", evs)
	}
	done := evs[len(evs)-2]
	if done.Index != 2 || done.Bytes != 2000 || len(done.Outputs) != 1 || done.Seconds <= 0 {
		t.Errorf("done b: %+v", done)
	}
	if end := evs[len(evs)-1]; end.Report == nil || len(end.Report.Stages) != 2 || end.Error != "" {
		t.Errorf("end: %+v", end)
	}
	if strings.Contains(stderr, "stage start") {
		t.Errorf("stage log lines at Info beside the events: %s", stderr)
	}

	evs, code, _ = runEvents(t, p)
	if code != 0 || len(evs) != 4 || evs[1].Event != pipeline.EventSkip || evs[2].Event != pipeline.EventSkip || evs[2].Index != 2 {
		t.Errorf("second run: %d %+v", code, evs)
	}
	evs, code, _ = runEvents(t, "--only", "nosuch", p)
	if code != 2 || len(evs) != 1 || evs[0].Event != pipeline.EventEnd || !strings.Contains(evs[0].Error, `--only "nosuch"`) {
		t.Errorf("refused run: %d %+v", code, evs)
	}
	if r := ferry(t, "pipeline", "run", "--events", "--json", p); r.code != 2 {
		t.Errorf("--events --json: %d", r.code)
	}
}
