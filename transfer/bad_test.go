package transfer

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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
	// A remote whose sha256 tools lie about files (and tell the truth
	// about an empty stdin, so the probe takes them).
	liar := t.TempDir()
	for _, tool := range []string{"openssl", "sha256sum", "shasum"} {
		script := "#!/bin/sh\nfor last; do :; done\nif [ -f \"$last\" ]; then echo 0000000000000000000000000000000000000000000000000000000000000000 \"$last\"; exit 0; fi\nexec /usr/bin/" + tool + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(liar, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := startSSHD(t, "PATH="+liar+":/usr/bin:/bin")
	honest := startSSHD(t)

	cases := []struct {
		name   string
		liar   bool
		setup  func(t *testing.T, dst string) (dir string) // returns the destination dir
		during func(src string) func(string, int64)        // progress hook
		kind   errkind.Kind
		want   string
	}{
		{name: "remote hash lies", liar: true, kind: errkind.VerifyFailed, want: "remote hash command reports a wrong digest"},
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

type hookReporter func(string, int64)

func (h hookReporter) SetTotal(int64) {}
func (h hookReporter) Add(n int64)    { h("", n) }
func (h hookReporter) Close() error   { return nil }
