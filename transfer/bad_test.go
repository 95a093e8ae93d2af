package transfer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// needRoot skips a test that needs root, loudly; under CI=true it fails.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "NOT RUN: needs root to " + why
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// send plans src and sends it to dst through s; it returns the report and
// error of Run.
func sendOne(t *testing.T, d Destination, src string, o Options) (*Report, error) {
	t.Helper()
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	o.StateDir = t.TempDir()
	o.Log = testLog(t)
	return Run(context.Background(), p, []Destination{d}, o)
}

// Each failure is an error naming the destination and the file, of the
// kind that gives the right exit code, leaves nothing at the destination
// under the file's name, and leaves the source as it was.
func TestBadCases(t *testing.T) {
	// A remote whose sha256 tools lie about files and about what dd
	// pipes into them (and tell the truth about an empty stdin and dd's
	// probe, so the probes take them): the chunk checks meet the lie.
	// Where there is no dd at all (a PATH of the liars alone) the files
	// are hashed whole, and that check meets it.
	liar := liarTools(t)
	s := startSSHD(t, "PATH="+liar+":/usr/bin:/bin")
	noDD := startSSHD(t, "PATH="+liar)
	honest := startSSHD(t)

	cases := []struct {
		name   string
		liar   bool
		noDD   bool                                        // the liar without dd
		setup  func(t *testing.T, dst string) (dir string) // returns the destination dir
		during func(src string) func(string, int64)        // progress hook
		kind   errkind.Kind
		want   string
	}{
		{name: "remote hash lies", liar: true, kind: errkind.VerifyFailed, want: "remote hash command reports a wrong digest"},
		{name: "remote hash lies, no dd", liar: true, noDD: true, kind: errkind.VerifyFailed, want: "remote hash command reports a wrong digest"},
		{name: "remote path is a file", setup: func(t *testing.T, dst string) string {
			p := filepath.Join(dst, "x")
			os.WriteFile(p, []byte("a file"), 0o644)
			return p
		}, kind: errkind.BadInput, want: "exists and is not a directory"},
		{name: "remote disk full", setup: func(t *testing.T, dst string) string {
			needRoot(t, "mount a 1 MiB tmpfs")
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", dst).CombinedOutput(); err != nil {
				t.Fatalf("mount tmpfs: %v: %s", err, out)
			}
			t.Cleanup(func() { exec.Command("umount", dst).Run() })
			return dst
		}, kind: errkind.Failure, want: "remote file system full"},
		{name: "permission denied", setup: func(t *testing.T, dst string) string {
			d := filepath.Join(dst, "ro")
			os.Mkdir(d, 0o755)
			if os.Geteuid() == 0 {
				// Root ignores modes; an immutable directory refuses root too (EPERM).
				if out, err := exec.Command("chattr", "+i", d).CombinedOutput(); err != nil {
					needRoot(t, "") // root, but chattr fails: say so
					t.Fatalf("chattr +i: %v: %s", err, out)
				}
				t.Cleanup(func() { exec.Command("chattr", "-i", d).Run() })
			} else {
				os.Chmod(d, 0o555)
			}
			return d
		}, kind: errkind.Failure, want: "permission denied"},
		{name: "source changed during the copy", during: func(src string) func(string, int64) {
			var once sync.Once
			return func(string, int64) {
				once.Do(func() {
					f, _ := os.OpenFile(src, os.O_WRONLY|os.O_APPEND, 0)
					f.Write([]byte("more"))
					f.Close()
				})
			}
		}, kind: errkind.BadInput, want: "source changed during the copy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "w.bin")
			randomFile(t, src, 2<<20, 5)
			before, _ := os.ReadFile(src)
			dst := t.TempDir()
			dir := dst
			if tc.setup != nil {
				dir = tc.setup(t, dst)
			}
			srv := honest
			if tc.liar {
				srv = s
			}
			if tc.noDD {
				srv = noDD
			}
			d := Destination{Name: "h1:" + dir, Host: "h1", Dir: dir, Dial: testDialer(srv, srv.Addr())}
			var o Options
			if tc.during != nil {
				hook := tc.during(src)
				o.Progress = func(string, int64) progressReporter { return hookReporter(hook) }
			}
			rep, err := sendOne(t, d, src, o)
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("error: %v", err)
			if k := errkind.Of(err); k != tc.kind {
				t.Errorf("kind %v, want %v", k, tc.kind)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "h1:"+dir) {
				t.Errorf("error %q does not name the destination and %q", msg, tc.want)
			}
			if tc.setup == nil && !strings.Contains(msg, "w.bin") {
				t.Errorf("error %q does not name the file", msg)
			}
			var fe *FailedError
			if !errors.As(err, &fe) || rep == nil || rep.Hosts[0].OK {
				t.Errorf("want a *FailedError and a failed host report; got %T, %+v", err, rep)
			}
			if tc.liar {
				// By chunk where dd is there, else by file.
				if got, byChunk := rep.Hosts[0].HashCommand, strings.HasPrefix(rep.Hosts[0].HashCommand, "dd | "); byChunk == tc.noDD {
					t.Errorf("verified with %q; want by chunk %v", got, !tc.noDD)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "w.bin")); err == nil {
				t.Error("w.bin is at the destination")
			}
			if tc.during == nil {
				if after, _ := os.ReadFile(src); string(after) != string(before) {
					t.Error("the source changed")
				}
			}
		})
	}
}

// liarTools is a directory of sha256 tools that lie about files and
// about what dd pipes into them (and tell the truth about an empty stdin
// and dd's probe, so the probes take them).
func liarTools(t testing.TB) string {
	liar := t.TempDir()
	for _, tool := range []string{"openssl", "sha256sum", "shasum"} {
		script := "#!/bin/sh\nfor last; do :; done\n" +
			"if [ -f \"$last\" ]; then echo " + zeros + " \"$last\"; exit 0; fi\n" +
			"out=$(/usr/bin/" + tool + " \"$@\")\n" +
			"case \"$out\" in " + emptySHA256 + "*|" + rangeProbeSHA256 + "*) echo \"$out\";; *) echo " + zeros + ";; esac\n"
		if err := os.WriteFile(filepath.Join(liar, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return liar
}

const zeros = "0000000000000000000000000000000000000000000000000000000000000000"

type hookReporter func(string, int64)

func (h hookReporter) SetTotal(int64) {}
func (h hookReporter) Add(n int64)    { h("", n) }
func (h hookReporter) Close() error   { return nil }

// A source rewritten after it was planned, in place with its size and
// mtime kept (so its stamp says nothing), is found by the hash of the
// chunks read for sending: an error, nothing under the file's name, and
// no journaled chunk of the other bytes kept for the next run. With dd on
// the remote host the remote checks are by chunk and compare with what
// was read, so this local check is what stands between the other bytes
// and the file's name.
func TestSourceRewrittenInPlace(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	want := randomFile(t, src, 1<<20, 21)
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(src, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{want[600000] ^ 1}, 600000)
	f.Close()
	if err := os.Chtimes(src, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	state := t.TempDir()
	d := Destination{Name: "h1:" + dst, Host: "h1", Dir: dst, Dial: testDialer(s, s.Addr())}
	rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
	if !errors.Is(err, ErrSourceChanged) || errkind.Of(err) != errkind.BadInput {
		t.Fatalf("err %v (kind %v), want ErrSourceChanged, bad input", err, errkind.Of(err))
	}
	if !strings.Contains(rep.Hosts[0].HashCommand, "dd | ") {
		t.Errorf("verified with %q, want by chunk", rep.Hosts[0].HashCommand)
	}
	if _, err := os.Stat(filepath.Join(dst, "w.bin")); err == nil {
		t.Fatal("w.bin is at the destination")
	}
	// Planned again, the file as it is now goes across whole.
	p, err = NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)}); err != nil {
		t.Fatal(err)
	}
	now, _ := os.ReadFile(src)
	if got, _ := os.ReadFile(filepath.Join(dst, "w.bin")); !bytes.Equal(got, now) {
		t.Error("the destination is not the source as it is now")
	}
}

// A remote hash command that never answers (a wedged tool, or a
// connection that died under it while it ran: either way no byte comes
// back) does not hang the transfer: the command has a time bound, and
// the run ends with an error naming the destination and the file, with
// nothing under the file's name.
func TestRemoteHashNeverAnswers(t *testing.T) {
	dir := t.TempDir()
	// Right about an empty stdin and dd's probe, silent on anything else.
	script := "#!/bin/sh\nout=$(/usr/bin/openssl \"$@\")\n" +
		"case \"$out\" in " + emptySHA256 + "*|" + rangeProbeSHA256 + "*) echo \"$out\"; exit 0;; esac\nsleep 30\n"
	if err := os.WriteFile(filepath.Join(dir, "openssl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s := startSSHD(t, "PATH="+dir+":/usr/bin:/bin")
	src := filepath.Join(t.TempDir(), "w.bin")
	randomFile(t, src, 200<<10, 3)
	dst := t.TempDir()
	d := Destination{Name: "h1:" + dst, Host: "h1", Dir: dst, Dial: testDialer(s, s.Addr())}
	start := time.Now()
	// A stall timeout that the probes and writes of a loaded machine stay
	// under; the hash command's own bound is then its 2 s floor.
	rep, err := sendOne(t, d, src, Options{Streams: 1, Retries: 1, Backoff: time.Millisecond, StallTimeout: time.Second})
	if err == nil {
		t.Fatal("no error")
	}
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if msg := err.Error(); !strings.Contains(msg, "gave no answer") || !strings.Contains(msg, "h1:"+dst) || !strings.Contains(msg, "w.bin") {
		t.Errorf("error %q does not say the hash command gave no answer, naming the destination and the file", msg)
	}
	if rep == nil || rep.Hosts[0].OK {
		t.Errorf("report %+v", rep)
	}
	if _, err := os.Stat(filepath.Join(dst, "w.bin")); err == nil {
		t.Error("w.bin is at the destination")
	}
}

// A destination on a file system that holds the file but not twice: a
// partial an earlier run left (killed, or stopped by a full disk) whose
// journal is gone is started again, and the room it takes is counted as
// freed by the truncation (the check once refused such a rerun forever);
// a resumed partial keeps its blocks and needs only the rest. Where the
// room is truly short (an older copy in place, replaced only once the new
// one is verified) the run stops before a byte is sent, saying what to
// delete.
func TestResumeOnFullDisk(t *testing.T) {
	needRoot(t, "mount a small tmpfs")
	s := startSSHD(t)
	const size = 3 << 20
	src := filepath.Join(t.TempDir(), "w.bin")
	want := randomFile(t, src, size, 8)
	mount := func(t *testing.T) string {
		dst := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dst).CombinedOutput(); err != nil {
			t.Fatalf("mount tmpfs: %v: %s", err, out)
		}
		t.Cleanup(func() { exec.Command("umount", dst).Run() })
		return dst
	}
	p, err := NewPlan(context.Background(), []string{src}, PlanOptions{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("stale partial", func(t *testing.T) {
		dst := mount(t)
		// What a run killed near its end leaves: a partial holding most
		// of the file, and no journal (another state directory).
		if err := os.WriteFile(filepath.Join(dst, "w.bin.partial"), want[:size-1000], 0o644); err != nil {
			t.Fatal(err)
		}
		d := Destination{Name: "h1:" + dst, Host: "h1", Dir: dst, Dial: testDialer(s, s.Addr())}
		if _, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)}); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(filepath.Join(dst, "w.bin")); !bytes.Equal(got, want) {
			t.Error("the file at the destination is not the source")
		}
	})
	t.Run("interrupted, resumed", func(t *testing.T) {
		dst := mount(t)
		state := t.TempDir()
		d := Destination{Name: "h1:" + dst, Host: "h1", Dir: dst, Dial: testDialer(s, s.Addr())}
		ctx, cancel := context.WithCancel(context.Background())
		var seen atomic.Int64
		_, err := Run(ctx, p, []Destination{d}, Options{StateDir: state, Log: testLog(t), Streams: 1,
			Progress: func(string, int64) progressReporter { return &cancelAt{n: &seen, at: size * 3 / 4, cancel: cancel} }})
		if !errors.Is(err, ErrInterrupted) {
			t.Fatalf("want the run interrupted, got %v", err)
		}
		rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: state, Log: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		if f := rep.Hosts[0].Files[0]; !f.Resumed || f.Sent >= size {
			t.Errorf("want the partial resumed; got %+v", f)
		}
		if got, _ := os.ReadFile(filepath.Join(dst, "w.bin")); !bytes.Equal(got, want) {
			t.Error("the file at the destination is not the source")
		}
	})
	t.Run("truly short", func(t *testing.T) {
		dst := mount(t)
		old := filepath.Join(dst, "w.bin")
		randomFile(t, old, size, 9) // an older version, of the same size
		d := Destination{Name: "h1:" + dst, Host: "h1", Dir: dst, Dial: testDialer(s, s.Addr())}
		rep, err := Run(context.Background(), p, []Destination{d}, Options{StateDir: t.TempDir(), Log: testLog(t)})
		if !errors.Is(err, ErrRemoteFull) {
			t.Fatalf("want %v, got %v", ErrRemoteFull, err)
		}
		msg := err.Error()
		t.Log(msg)
		if !strings.Contains(msg, "older copies there of w.bin") || !strings.Contains(msg, "delete them first") {
			t.Errorf("error %q does not say what to delete", msg)
		}
		if rep.Hosts[0].Sent != 0 || len(partials(t, dst)) != 0 {
			t.Errorf("bytes were sent (%d) or a partial made before the room was known to be short", rep.Hosts[0].Sent)
		}
	})
}

// A destination under /proc (no blocks, nothing free) fails with the error
// the server gives, not as a full file system.
func TestProcDestination(t *testing.T) {
	s := startSSHD(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	randomFile(t, src, 1000, 1)
	for _, dir := range []string{"/proc", "/proc/self/ferry-transfer-test"} {
		d := Destination{Name: "h1:" + dir, Host: "h1", Dir: dir, Dial: testDialer(s, s.Addr())}
		_, err := sendOne(t, d, src, Options{})
		if err == nil {
			t.Fatalf("%s: no error", dir)
		}
		t.Log(err)
		if errors.Is(err, ErrRemoteFull) || strings.Contains(err.Error(), "full") {
			t.Errorf("error %q calls /proc full", err)
		}
		if !strings.Contains(err.Error(), dir) {
			t.Errorf("error %q does not name the path", err)
		}
	}
}
