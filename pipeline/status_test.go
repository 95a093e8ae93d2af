package pipeline_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/pipeline"
)

func statusOf(t *testing.T, p, stage string) pipeline.StageStatus {
	t.Helper()
	r := ferry(t, "pipeline", "status", "--json", p)
	var rep pipeline.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	for _, s := range rep.Stages {
		if s.Stage == stage {
			return s
		}
	}
	t.Fatalf("status has no stage %s", stage)
	return pipeline.StageStatus{}
}

// A first run whose out: view cannot be made (a file of the user's is in
// the way) fails: the run table says failed with the reason, not "run …
// new", and status shows that failure, not "b.bin: missing". Once the way
// is clear the next run makes the view and status is complete again.
func TestCLIStatusViewFailure(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "m/a.bin"), strings.Repeat("a", 4096))
	write(t, filepath.Join(dir, "m/b.bin"), strings.Repeat("b", 4096))
	write(t, filepath.Join(dir, "out/m/b.bin"), "the user's own file")
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: v\nstages:\n  - name: m\n    import: { path: m }\n    out: out/m\n")

	r := ferry(t, "pipeline", "run", p)
	if r.code == 0 {
		t.Fatalf("run over a conflicting view: exit 0\n%s", r.stdout)
	}
	if !regexp.MustCompile(`(?m)^\s+m\s+import\s+failed\s.*out/m/b\.bin.*not a ferry symlink`).MatchString(r.stdout) {
		t.Errorf("run table does not show the failure:\n%s", r.stdout)
	}
	r = ferry(t, "pipeline", "status", p)
	if !regexp.MustCompile(`(?m)^m \(import\): failed; .*out/m/b\.bin.*not a ferry symlink`).MatchString(r.stdout) || strings.Contains(r.stdout, "missing") {
		t.Errorf("status after the view failed:\n%s", r.stdout)
	}
	if s := statusOf(t, p, "m"); s.State != pipeline.StateFailed || !strings.Contains(s.Error, "not a ferry symlink") || len(s.Outputs) != 2 {
		t.Errorf("status --json: %+v", s)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out/m/b.bin")); string(b) != "the user's own file" {
		t.Errorf("the user's file was touched: %q", b)
	}

	os.Remove(filepath.Join(dir, "out/m/b.bin"))
	if r := ferry(t, "pipeline", "run", p); r.code != 0 || !regexp.MustCompile(`(?m)^\s+m\s+import\s+skip`).MatchString(r.stdout) {
		t.Fatalf("run with the way clear: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if s := statusOf(t, p, "m"); s.State != pipeline.StateComplete || s.Error != "" || s.Detail != "" {
		t.Errorf("status after the view was made: %+v", s)
	}
}

// A stage that fails while it runs (verify_mtp over an adapter, which is
// not a checkpoint): status shows the error the run ended with.
func TestCLIStatusStageFailure(t *testing.T) {
	models, _ := filepath.Abs("../testdata/models/qwen35-tiny")
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: f\nstages:\n  - name: a\n    import: { path: "+models+"/adapter-dora }\n"+
		"  - name: check\n    verify_mtp: { from: a, require: true }\n")
	r := ferry(t, "pipeline", "run", p)
	if r.code == 0 || !strings.Contains(r.stderr, "not a safetensors checkpoint") {
		t.Fatalf("run: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	s := statusOf(t, p, "check")
	if s.State != pipeline.StateFailed || !strings.Contains(s.Error, "not a safetensors checkpoint") {
		t.Errorf("status after a failed stage: %+v", s)
	}
	if r := ferry(t, "pipeline", "status", p); !strings.Contains(r.stdout, "check (verify_mtp): failed; verify_mtp a: ") {
		t.Errorf("status:\n%s", r.stdout)
	}
}

// A run SIGKILLed inside a stage: status says the stage is partial and how
// much it left to resume from, not never-run; plan says the same; the next
// run finishes it and status is complete.
func TestCLIStatusAfterKill(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: k\nstages:\n  - name: big\n    synth: { size: 256MiB, units: 256, seed: 4 }\n")
	cmd := exec.Command(ferryBinary(t), "pipeline", "run", p)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Kill once a few units are durable in the journal.
	journals := filepath.Join(dir, ".ferry", "ingest", "*", "*", "journal")
	deadline := time.Now().Add(60 * time.Second)
	for {
		var lines int
		if m, _ := filepath.Glob(journals); len(m) == 1 {
			b, _ := os.ReadFile(m[0])
			lines = strings.Count(string(b), `"unit"`)
		}
		if lines >= 4 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("run ended before it could be killed: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no unit became durable in 60 s")
		}
	}
	cmd.Process.Kill()
	<-exited

	s := statusOf(t, p, "big")
	if s.State != pipeline.StatePartial || s.Resumable < 4<<20 || s.Error != "" {
		t.Errorf("status after kill: %+v", s)
	}
	want := "big (synth): partial (" + pipeline.FormatBytes(s.Resumable) + " resumable)"
	if r := ferry(t, "pipeline", "status", p); !strings.Contains(r.stdout, want) {
		t.Errorf("status after kill, want %q:\n%s", want, r.stdout)
	}
	if r := ferry(t, "pipeline", "plan", p); !regexp.MustCompile(`(?m)^\s+big\s+synth\s+run\s+new; [0-9.]+ MB resumable`).MatchString(r.stdout) {
		t.Errorf("plan after kill:\n%s", r.stdout)
	}
	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatalf("resumed run: exit %d %s", r.code, r.stderr)
	}
	if s := statusOf(t, p, "big"); s.State != pipeline.StateComplete || s.Resumable != 0 {
		t.Errorf("status after the resumed run: %+v", s)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 KB", 266_000_000: "266 MB", 4_194_304: "4.2 MB", 1_500_000_000: "1.5 GB"} {
		if got := pipeline.FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// interruptRun starts `ferry pipeline run ARGS...`, sends it SIGINT (as
// Ctrl-C does) once the stage it runs has made two more units durable in
// its journal (under dir's store), and returns its exit code, stdout and
// stderr.
func interruptRun(t *testing.T, dir string, args ...string) (int, string, string) {
	t.Helper()
	journals := filepath.Join(dir, ".ferry", "ingest", "*", "*", "journal")
	units := func() int {
		m, _ := filepath.Glob(journals)
		if len(m) != 1 {
			return 0
		}
		b, _ := os.ReadFile(m[0])
		return strings.Count(string(b), `"unit"`)
	}
	before := units() // what an earlier interrupted run left
	cmd := exec.Command(ferryBinary(t), append([]string{"pipeline", "run"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if units() >= before+2 {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("run ended before it could be interrupted: %v\n%s", err, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("no unit became durable in 60 s")
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	<-exited
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// Ctrl-C during a run: exit 130; the message says the run was interrupted,
// which stage was running and what it left, how to resume, and does not
// end in "context canceled"; the run table, the events and status say
// interrupted (not failed, not partial); the stage after it did not start.
func TestCLIInterrupt(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: i\nstages:\n  - name: big\n    synth: { size: 256MiB, units: 256, seed: 4 }\n  - name: next\n    synth: { size: 1KiB, from: big }\n")
	lastLine := func(s string) string {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		return lines[len(lines)-1]
	}
	checkMessage := func(what string, code int, stderr string) {
		t.Helper()
		msg := lastLine(stderr)
		if code != 130 || !strings.HasPrefix(msg, "ferry: interrupted; stage big was running (") ||
			!strings.HasSuffix(msg, " resumable); the stages that finished are recorded; run the same command again to resume") ||
			strings.Contains(stderr, "context canceled") {
			t.Errorf("%s: exit %d, last line %q; want 130, interrupted, what big left and how to resume, no 'context canceled'\n%s", what, code, msg, stderr)
		}
	}

	code, stdout, stderr := interruptRun(t, dir, "-j", "1", p)
	checkMessage("run", code, stderr)
	if !regexp.MustCompile(`(?m)^\s+big\s+synth\s+interrupted\s+[0-9.]+s\s+new; .*; [0-9.]+ MB resumable$`).MatchString(stdout) ||
		!regexp.MustCompile(`(?m)^\s+next\s+synth\s+blocked\s+cancelled before it started$`).MatchString(stdout) {
		t.Errorf("run table: want big interrupted with its seconds and what it left, next not started:\n%s", stdout)
	}
	s := statusOf(t, p, "big")
	if s.State != "interrupted" || s.Resumable <= 0 || s.Error != "" {
		t.Errorf("status after Ctrl-C: %+v", s)
	}
	want := "big (synth): interrupted (" + pipeline.FormatBytes(s.Resumable) + " resumable)"
	if r := ferry(t, "pipeline", "status", p); !strings.Contains(r.stdout, want) {
		t.Errorf("status after Ctrl-C, want %q:\n%s", want, r.stdout)
	}

	// Again with --events: an interrupted event for big, none failed, and
	// the end event carries the same message and the report.
	code, stdout, stderr = interruptRun(t, dir, "-j", "1", "--events", p)
	checkMessage("run --events", code, stderr)
	var seq []string
	var end pipeline.Event
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var e pipeline.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("event line %q: %v", l, err)
		}
		switch e.Event {
		case "interrupted", pipeline.EventFailed, pipeline.EventDone:
			seq = append(seq, string(e.Event)+" "+e.Stage)
		case pipeline.EventEnd:
			end = e
		}
	}
	if g := strings.Join(seq, ","); g != "interrupted big" {
		t.Errorf("events %q, want interrupted big", g)
	}
	if !strings.HasPrefix(end.Error, "interrupted; stage big was running (") || strings.Contains(end.Error, "context canceled") ||
		end.Report == nil || end.Report.Stages[0].Action != "interrupted" {
		t.Errorf("end event: %+v", end)
	}

	if r := ferry(t, "pipeline", "run", p); r.code != 0 {
		t.Fatalf("resumed run: exit %d %s", r.code, r.stderr)
	}
	if s := statusOf(t, p, "big"); s.State != pipeline.StateComplete {
		t.Errorf("status after the resumed run: %+v", s)
	}
}
