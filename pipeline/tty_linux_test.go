package pipeline_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-llm/ferry/internal/ptytest"
)

// On a terminal each running stage draws a byte progress bar (named after
// the stage); elsewhere the run logs plain progress lines.
func TestCLIProgress(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: tty\nstages:\n  - name: bigstage\n    synth: { size: 96MiB, units: 48 }\n  - name: other\n    synth: { size: 96MiB, units: 48, seed: 5 }\n")

	tty, stdout := runTTY(t, "pipeline", "run", "-j", "2", p)
	// One line per running stage, with bytes done / total.
	s := tty
	for _, st := range []string{"bigstage", "other"} {
		if !regexp.MustCompile(st + `\s+\d+% \|.*\(\d+(\.\d+)?/(101|100\.\d+) MB`).MatchString(s) {
			t.Errorf("no progress bar for %s on the terminal: %q", st, s)
		}
	}
	if strings.Contains(s, "msg=progress") {
		t.Errorf("plain progress lines on a terminal: %q", s)
	}
	if !strings.Contains(stdout, "bigstage") {
		t.Errorf("stdout lacks the report: %q", stdout)
	}

	// Not a terminal: plain log lines.
	r := ferry(t, "pipeline", "run", "--force", "bigstage", p)
	if r.code != 0 || !strings.Contains(r.stderr, `msg="stage start" stage=bigstage`) ||
		!strings.Contains(r.stderr, "msg=progress stage=bigstage") || !strings.Contains(r.stderr, `msg="stage done" stage=bigstage`) {
		t.Errorf("log lines: %q", r.stderr)
	}
}

// SIGINT (Ctrl-C) cancels the run through its context: exit 130 with a
// message that says so (not "context canceled"), the lock released, no
// record, status says interrupted, and the next run resumes to the digest
// of an uninterrupted one.
func TestCLIInterruptResumes(t *testing.T) {
	const spec = "name: int\nstages:\n  - name: big\n    synth: { size: 128MiB, units: 64, seed: 9 }\n"
	ref := filepath.Join(t.TempDir(), "p.yaml")
	write(t, ref, spec)
	r := ferry(t, "pipeline", "run", ref)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	want := regexpDigest(t, ferry(t, "pipeline", "status", ref).stdout)

	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, spec)
	var errb bytes.Buffer
	cmd := exec.Command(ferryBinary(t), "--verbose", "pipeline", "run", p)
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		j, _ := filepath.Glob(filepath.Join(dir, ".ferry", "ingest", "*", "*", "journal"))
		if len(j) == 0 {
			return false
		}
		b, _ := os.ReadFile(j[0])
		return bytes.Count(b, []byte(`"unit"`)) >= 8
	})
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if err == nil {
		t.Fatal("interrupted run exited 0")
	}
	if c := cmd.ProcessState.ExitCode(); c != 130 {
		t.Errorf("interrupted run exited %d, want 130", c)
	}
	if !strings.Contains(errb.String(), "ferry: interrupted; stage big was running (") || strings.Contains(errb.String(), "context canceled") {
		t.Errorf("stderr: %s", errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, ".ferry", "lock")); !errors.Is(err, os.ErrNotExist) {
		t.Error("an interrupted run left its lock")
	}
	if s := ferry(t, "pipeline", "status", p).stdout; !regexp.MustCompile(`big \(synth\): interrupted \([0-9.]+ MB resumable\)`).MatchString(s) {
		t.Errorf("status after interrupt: %s", s)
	}
	r = ferry(t, "--verbose", "pipeline", "run", p)
	if r.code != 0 {
		t.Fatal(r.stderr)
	}
	if strings.Contains(r.stderr, `msg="synth unit begin" stage=big unit=0 `) || strings.Contains(r.stderr, "unit=0\n") {
		t.Error("the resumed run began again at unit 0")
	}
	if got := regexpDigest(t, ferry(t, "pipeline", "status", p).stdout); got != want {
		t.Errorf("resumed digest %s, uninterrupted %s", got, want)
	}
}

func regexpDigest(t *testing.T, s string) string {
	t.Helper()
	i := strings.Index(s, "sha256:")
	if i < 0 {
		t.Fatalf("no digest in %q", s)
	}
	return s[i : i+71]
}

// runTTY runs ferry with its stderr on a terminal and returns what the
// terminal showed and stdout.
func runTTY(t *testing.T, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(ferryBinary(t), args...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	tty, err := ptytest.Run(t, cmd)
	if err != nil {
		t.Fatalf("%v: %v; terminal: %q", args, err, tty)
	}
	return tty, stdout.String()
}

// On a terminal a run is one display: the pipeline's stage count, a line
// per stage as it starts (why) and ends (time, outputs, size, view), a
// bar named "[k/n] stage" while it runs, skipped stages as up to date;
// the stage log lines are not repeated beside it.
func TestCLIDisplay(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: tty\nstages:\n  - name: a\n    synth: { size: 8MiB, units: 8 }\n  - name: b\n    synth: { size: 2000, units: 2, from: a }\n")
	tty, _ := runTTY(t, "pipeline", "run", "-j", "1", p)
	for _, re := range []string{
		`pipeline tty: 2 stages\r?\n`,
		`  > \[1/2\] a \(synth\): new\r?\n`,
		`\[1/2\] a\s+\d+% \|`,
		`  ✓ \[1/2\] a \(synth\): done in [0-9.]+s, 1 output, 8\.4 MB -> ` + regexp.QuoteMeta(filepath.Join(dir, ".ferry/views/a")) + `\r?\n`,
		`  > \[2/2\] b \(synth\): new\r?\n`,
		`  ✓ \[2/2\] b \(synth\): done in [0-9.]+s, 1 output, 2\.0 KB -> `,
	} {
		if !regexp.MustCompile(re).MatchString(tty) {
			t.Errorf("terminal lacks %s:\n%q", re, tty)
		}
	}
	if strings.Contains(tty, `msg="stage start"`) {
		t.Errorf("stage log lines beside the display: %q", tty)
	}
	tty, _ = runTTY(t, "pipeline", "run", p)
	if !regexp.MustCompile(`  = \[2/2\] b \(synth\): up to date, 1 output, 2\.0 KB`).MatchString(tty) {
		t.Errorf("second run: %q", tty)
	}
}

// On a terminal a warning is shown once: its log line, above the bars;
// the display draws no line of its own for its event.
func TestCLIDisplayWarning(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "model", "a.bin"), "weights")
	write(t, filepath.Join(dir, "backup", "model", "old-Q6_K.gguf"), "an older quant")
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: tty\nstages:\n  - name: model\n    import: { path: model }\n  - name: shipped\n    transfer: { from: [model], to: [backup], skip_netcheck: true }\n")
	tty, _ := runTTY(t, "pipeline", "run", p)
	if n := strings.Count(tty, "that the stage did not put there"); n != 1 || !strings.Contains(tty, "level=WARN") {
		t.Errorf("the warning %d times on the terminal, want its log line once:\n%q", n, tty)
	}
}

// On a terminal, a stage that Ctrl-C stops gets its own line in the
// display: interrupted, after how long, what it left; not failed.
func TestCLIDisplayInterrupted(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.yaml")
	write(t, p, "name: tty\nstages:\n  - name: big\n    synth: { size: 256MiB, units: 256, seed: 5 }\n  - name: next\n    synth: { size: 2000, units: 2, from: big }\n")
	master, slave := ptytest.Open(t)
	defer master.Close()
	cmd := exec.Command(ferryBinary(t), "pipeline", "run", "-j", "1", p)
	cmd.Stderr = slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var tty bytes.Buffer
	copied := make(chan error, 1)
	go func() { _, err := io.Copy(&tty, master); copied <- err }()
	waitFor(t, func() bool {
		j, _ := filepath.Glob(filepath.Join(dir, ".ferry", "ingest", "*", "*", "journal"))
		if len(j) == 0 {
			return false
		}
		b, _ := os.ReadFile(j[0])
		return bytes.Count(b, []byte(`"unit"`)) >= 4
	})
	cmd.Process.Signal(os.Interrupt)
	cmd.Wait()
	if err := <-copied; err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	if c := cmd.ProcessState.ExitCode(); c != 130 {
		t.Errorf("exit %d, want 130", c)
	}
	out := tty.String()
	if !regexp.MustCompile(`  ! \[1/2\] big \(synth\): interrupted after [0-9.]+s; [0-9.]+ MB resumable\r?\n`).MatchString(out) ||
		strings.Contains(out, "failed") || strings.Contains(out, "context canceled") {
		t.Errorf("terminal: want big's interrupted line, nothing failed, no 'context canceled':\n%q", out)
	}
}
