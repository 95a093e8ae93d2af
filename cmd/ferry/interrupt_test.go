package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// sigintChild runs ferry as a child process, waits until started() reports
// that it has begun writing, lets it run for another `after`, then sends it
// a real SIGINT and returns its stderr and exit code. finished() reports an
// output that is already complete: the child ran to its end before the
// signal landed (on a loaded machine a run can be several times faster
// than the reference run `after` was measured on). Then reset() removes
// what it wrote and the child runs again with half the delay, at most five
// times, before the test fails.
func sigintChild(t *testing.T, started, finished func() bool, reset func(), after time.Duration, args ...string) (string, int) {
	t.Helper()
	for try := 1; ; try++ {
		stderr, code, landed := sigintOnce(t, started, finished, after, args...)
		if landed {
			return stderr, code
		}
		if try == 5 {
			t.Fatalf("the command finished before the interrupt landed, %d times (last delay %v): %s", try, after, stderr)
		}
		t.Logf("try %d: the command finished before the interrupt landed after %v; again with half the delay", try, after)
		reset()
		after /= 2
	}
}

func sigintOnce(t *testing.T, started, finished func() bool, after time.Duration, args ...string) (string, int, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for !started() {
		if finished() {
			cmd.Wait()
			return stderr.String(), cmd.ProcessState.ExitCode(), false
		}
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(after)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if finished() {
		return stderr.String(), cmd.ProcessState.ExitCode(), false
	}
	return stderr.String(), cmd.ProcessState.ExitCode(), true
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
