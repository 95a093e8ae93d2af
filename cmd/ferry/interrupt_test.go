package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/pipeline"
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

// checkInterrupted checks what an interrupted command printed last: that
// it was interrupted, and never Go's "context canceled" nor the signal
// context's cause ("interrupt signal received").
func checkInterrupted(t *testing.T, stderr string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "ferry: interrupted") || strings.Contains(stderr, context.Canceled.Error()) || strings.Contains(stderr, "signal received") {
		t.Errorf("an interrupted command's message should begin \"ferry: interrupted\" and never say %q or \"interrupt signal received\":\n%s", context.Canceled, stderr)
	}
}

// The line main prints for an error: an interrupted command says so first
// and what it leaves, and never ends in (or says) "context canceled",
// however the cancellation reached it; other errors print as they are.
func TestErrorMessage(t *testing.T) {
	// A context cancelled as main's is by Ctrl-C: os/signal's, by a real
	// signal (SIGUSR1, which it catches), with the signal as its cause.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGUSR1)
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the signal did not cancel the context")
	}
	cut := fmt.Errorf("shard 3 of 7: %w", ctx.Err())         // a write the cancellation cut short
	byCause := fmt.Errorf("shard 2: %w", context.Cause(ctx)) // internal/workers returns the cause
	lockWait := fmt.Errorf("/m/out.lock: stopped waiting for the output lock, held by pid 7 on host h since 2026-01-02T03:04:05Z (ferry mlx quantize): %w", ctx.Err())
	run := &pipeline.InterruptedError{Running: []pipeline.InterruptedStage{{Stage: "merged", Resumable: 7_400_000}}, Err: ctx.Err()}
	runFailed := &pipeline.InterruptedError{Failed: []error{errors.New("stage q: disk full")}, Err: ctx.Err()}
	runSharing := &pipeline.InterruptedError{Sharing: []string{"merged"}, SharedTo: "s3://models/ferry", Err: ctx.Err()}
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"a failure", errors.New("m.gguf: tensor \"a\": truncated"), "m.gguf: tensor \"a\": truncated"},
		{"a timeout is not an interrupt", fmt.Errorf("dial h: %w", context.DeadlineExceeded), "dial h: context deadline exceeded"},
		{"a resumable command", interruptedResume(ctx, cut, "%s was not written: 3 of 7 shards are durable", "out"),
			"interrupted; out was not written: 3 of 7 shards are durable; run the same command again to resume"},
		{"the bare cancellation", interrupted(ctx, ctx.Err()), "interrupted"},
		{"a cancellation wrapped", interrupted(ctx, cut), "interrupted: shard 3 of 7"},
		{"any error of a cancelled command", interrupted(ctx, errors.New("read x: file already closed")), "interrupted: read x: file already closed"},
		{"joined", interrupted(ctx, errors.Join(fmt.Errorf("stage a: %w", ctx.Err()), ctx.Err())), "interrupted: stage a"},
		{"the signal as cause", interrupted(ctx, fmt.Errorf("merge: %w", byCause)), "interrupted: merge: shard 2"},
		{"a resumable command stopped by the cause", interruptedResume(ctx, byCause, "out is not complete"),
			"interrupted; out is not complete; run the same command again to resume"},
		{"a lock wait", interrupted(ctx, lockWait), "interrupted: /m/out.lock: stopped waiting for the output lock, held by pid 7 on host h since 2026-01-02T03:04:05Z (ferry mlx quantize)"},
		{"a pipeline run", interruptedResume(ctx, run, "%s", run.Left()),
			"interrupted; stage merged was running (7.4 MB resumable); the stages that finished are recorded; run the same command again to resume"},
		{"a pipeline run uploading", interruptedResume(ctx, runSharing, "%s", runSharing.Left()),
			"interrupted; no stage was running; the stages that finished are recorded; merged not in s3://models/ferry yet (it was uploading: the next run shares it); run the same command again to resume"},
		{"a pipeline run with a failure", interruptedResume(ctx, runFailed, "%s", runFailed.Left()),
			"interrupted; no stage was running; the stages that finished are recorded; failed before the interrupt: stage q: disk full; run the same command again to resume"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := errorMessage(ctx, tt.err); got != tt.want {
				t.Errorf("errorMessage: %q, want %q", got, tt.want)
			}
			if interrupted := strings.HasPrefix(tt.want, "interrupted"); interrupted != (exitCode(tt.err) == exitInterrupted) {
				t.Errorf("exit %d for %q", exitCode(tt.err), tt.want)
			}
		})
	}
	// interruptedResume keeps what stopped the command in the chain.
	if err := interruptedResume(ctx, cut, "x"); !errors.Is(err, context.Canceled) || errkind.Of(err) != errkind.Interrupted {
		t.Errorf("interruptedResume: %v (kind %v) lost the cancellation or its kind", err, errkind.Of(err))
	}
}

// Ctrl-C while a command waits for another's output lock (--lock-wait):
// exit 130, and the message says it was interrupted while waiting and
// for whom, not "context canceled"; nothing is written.
func TestInterruptLockWait(t *testing.T) {
	base, _ := lockRaceModel(t)
	holder := exec.Command("sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	host, _ := os.Hostname()
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	lock := fmt.Sprintf(`{"pid":%d,"host":%q,"started":"2026-01-02T03:04:05Z","command":"ferry mlx quantize"}`, holder.Process.Pid, host)
	if err := os.WriteFile(out+".lock", []byte(lock), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "gguf", "convert", base, "-o", out, "--lock-wait", "1m")
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var errb lockedBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.After(time.Minute)
	for !strings.Contains(errb.String(), "waiting for the output lock") {
		select {
		case <-exited:
			t.Fatalf("never waited for the lock: exit %d: %s", cmd.ProcessState.ExitCode(), errb.String())
		case <-deadline:
			cmd.Process.Kill()
			<-exited
			t.Fatalf("no word of waiting for the lock in a minute: %s", errb.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	<-exited
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
		t.Errorf("exit %d, want %d", code, exitInterrupted)
	}
	stderr := errb.String()
	checkInterrupted(t, stderr)
	want := fmt.Sprintf("ferry: interrupted: %s.lock: stopped waiting for the output lock, held by pid %d on host %s since 2026-01-02T03:04:05Z (ferry mlx quantize)\n", out, holder.Process.Pid, host)
	if !strings.HasSuffix(stderr, want) {
		t.Errorf("stderr %q, want it to end %q", stderr, want)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("beside the lock: %v", ents)
	}
}

// lockedBuffer is a bytes.Buffer a child process writes while the test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
