package transfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// fileDigest is the sha256 of the file at p.
func fileDigest(t testing.TB, p string) digest.Digest {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return digest.New(s[:])
}

// startSSHD starts the test sshd. Its sessions get a HOME of their own
// (plus the environment in env, "NAME=VALUE"), so that the remote
// commands the engine runs do not source the user's shell rc files: a
// ~/.bashrc that initialises pyenv cost 5 s per command on one machine.
func startSSHD(t testing.TB, env ...string) *sshdtest.Server {
	t.Helper()
	home := t.TempDir()
	return sshdtest.Start(t, sshdtest.SSHDConfig("SetEnv "+strings.Join(append([]string{"HOME=" + home}, env...), " ")))
}

// testDialer connects to the test sshd at addr (which may be a proxy in
// front of it) with the server's client key and pinned host key. The
// engine takes any Dialer; the CLI's comes from sshconn.
func testDialer(s *sshdtest.Server, addr string) Dialer {
	cfg := &ssh.ClientConfig{
		User:            s.User,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(s.ClientKey)},
		HostKeyCallback: ssh.FixedHostKey(s.HostKey),
		Timeout:         10 * time.Second,
	}
	return func(ctx context.Context) (*ssh.Client, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if dl, ok := ctx.Deadline(); ok {
			nc.SetDeadline(dl)
		}
		c, chans, reqs, err := ssh.NewClientConn(nc, addr, cfg)
		if err != nil {
			nc.Close()
			return nil, err
		}
		nc.SetDeadline(time.Time{})
		return ssh.NewClient(c, chans, reqs), nil
	}
}

// randomFile writes n deterministic pseudo-random bytes to path.
func randomFile(t testing.TB, path string, n int64, seed uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

// testLog is a logger writing to the test log.
func testLog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// sameTree fails unless every file under want has the same bytes under got
// and every link the same target.
func sameTree(t testing.TB, want, got string) { t.Helper(); sameTreeOf(t, want, got, false) }

// sameTreeOf is sameTree where, with copiesLinks, a link under want is
// matched by a file under got holding what it points to.
func sameTreeOf(t testing.TB, want, got string, copiesLinks bool) {
	t.Helper()
	err := filepath.Walk(want, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		q := filepath.Join(got, rel)
		switch {
		case fi.Mode()&os.ModeSymlink != 0 && copiesLinks:
			a, _ := os.ReadFile(p)
			b, err := os.ReadFile(q)
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s: not a copy of what the link points to (%v)", rel, err)
			}
		case fi.Mode()&os.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, err := os.Readlink(q)
			if err != nil || a != b {
				t.Errorf("%s: link %q, got %q (%v)", rel, a, b, err)
			}
		case fi.Mode().IsRegular():
			a, _ := os.ReadFile(p)
			b, err := os.ReadFile(q)
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s: contents differ (%v)", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// partials lists the *.partial files under dir.
func partials(t testing.TB, dir string) []string {
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".partial") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

var _ = io.EOF

// countSourceReads counts, until the test ends, how often each piece of a
// source ("rel@offset") is read; the map is read once the run is over.
func countSourceReads(t *testing.T) map[string]int {
	var mu sync.Mutex
	reads := map[string]int{}
	hookSourceRead = func(rel string, off int64) {
		mu.Lock()
		reads[fmt.Sprintf("%s@%d", rel, off)]++
		mu.Unlock()
	}
	t.Cleanup(func() { hookSourceRead = nil })
	return reads
}
