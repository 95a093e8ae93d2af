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
// signal could land, which fails the test.
func sigintChild(t *testing.T, started, finished func() bool, after time.Duration, args ...string) (string, int) {
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
			t.Fatal("the command finished before it could be interrupted")
		}
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(after)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	if finished() {
		t.Fatalf("the command finished before the interrupt landed: %s", stderr.String())
	}
	return stderr.String(), cmd.ProcessState.ExitCode()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
