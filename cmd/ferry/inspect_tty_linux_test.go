package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/inspect"
	"github.com/ferry-llm/ferry/internal/ptytest"
)

// With stderr on a terminal, --hash draws a byte progress bar there, and
// stdout still carries only the result.
func TestInspectHashProgressOnTTY(t *testing.T) {
	cmd := exec.Command(os.Args[0], "inspect", "--json", "--hash", "--jobs", "1", bundledBase)
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	tty, err := ptytest.Run(t, cmd)
	if err != nil {
		t.Fatalf("inspect: %v; terminal: %q", err, tty)
	}
	if !strings.Contains(tty, "hashing") {
		t.Errorf("no progress bar on the terminal: %q", tty)
	}
	var rep inspect.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || len(rep.Tensors) != 71 {
		t.Errorf("stdout is not the JSON report: %v", err)
	}
}

// With stderr not a terminal, a long command logs a plain progress line
// every interval (FERRY_PROGRESS_INTERVAL) with bytes, total, rate and ETA,
// the last at 100%; stdout still carries only the result.
func TestInspectHashProgressPlainLines(t *testing.T) {
	r := execFerry(t, []string{"FERRY_PROGRESS_INTERVAL=1ms"}, "inspect", "--json", "--hash", "--jobs", "1", bundledBase)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	line := regexp.MustCompile(`time=\S+ level=INFO msg=progress task="inspect --hash" bytes=(\d+)(?: of=(\d+) pct=(\d+))? rate=\d+\.\d[kMGT]?B/s(?: eta=\S+)?\n`)
	lines := line.FindAllStringSubmatch(r.stderr, -1)
	if len(lines) < 2 || len(line.ReplaceAllString(r.stderr, "")) > 0 { // a periodic line or more, and the last one
		t.Fatalf("want periodic progress lines, got %q", r.stderr)
	}
	if last := lines[len(lines)-1]; last[1] != last[2] || last[3] != "100" {
		t.Errorf("last line is not at 100%%: %q", last[0])
	}
	for _, l := range lines {
		if l[1] != "0" && l[2] != "" && l[1] != l[2] && !strings.Contains(l[0], " eta=") {
			t.Errorf("a line short of the total does not say the time left: %q", l[0])
		}
	}
	if strings.Contains(r.stderr, "\r") || strings.Contains(r.stderr, "\x1b[") {
		t.Errorf("terminal control characters off a terminal: %q", r.stderr)
	}
	var rep inspect.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Errorf("stdout is not the JSON report: %v", err)
	}
}
