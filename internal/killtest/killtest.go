// Package killtest holds what the kill -9 tests of several packages share:
// killing a child at random moments and making sure some kill left work for
// the next run to resume.
package killtest

import (
	"math/rand/v2"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// AtRandom starts n children (start) one after another and SIGKILLs each at
// a random moment in [0, full), full being an uninterrupted run's length.
// After each kill, finished checks what the child left and says whether it
// had finished (clearing its output for the next, if so). A kill after
// which durable says a journal holds finished work is a resume the next
// child makes. If no random moment gave one (a loaded machine runs the
// child slower than the timed run), one more child is killed as soon as
// durable turns true; the test fails if that does not happen within two
// minutes either.
func AtRandom(t testing.TB, n int, full time.Duration, rng *rand.Rand, start func() *exec.Cmd, finished func(kill int) bool, durable func() bool) {
	t.Helper()
	run := func(kill int, ready func() bool) bool {
		cmd := start()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for !ready() {
			time.Sleep(2 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		return !finished(kill) && durable()
	}
	resumable := 0
	for kill := range n {
		at := time.Now().Add(time.Duration(rng.Int64N(int64(full))))
		if run(kill, func() bool { return !time.Now().Before(at) }) {
			resumable++
		}
	}
	t.Logf("%d of %d kills at random moments left durable work for the next run to keep", resumable, n)
	if resumable > 0 {
		return
	}
	deadline := time.Now().Add(2 * time.Minute)
	if !run(n, func() bool { return durable() || time.Now().After(deadline) }) {
		t.Error("no kill left a journal with durable work: the test never exercised a resume")
		return
	}
	t.Logf("kill %d, right after the first durable work, left journals to resume from", n+1)
}
