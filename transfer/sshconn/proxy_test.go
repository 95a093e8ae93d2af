package sshconn

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// stallProxy forwards TCP to a server until stalled: from then on it
// holds every byte (the peer looks alive to the kernel, dead to SSH).
type stallProxy struct {
	l     net.Listener
	mu    sync.Mutex
	stall chan struct{}
	conns []net.Conn
	reset bool // close each new connection at once, with a RST
}

func newStallProxy(t *testing.T, to string, reset bool) *stallProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{l: l, stall: make(chan struct{}), reset: reset}
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if p.reset {
				c.(*net.TCPConn).SetLinger(0) // RST, not FIN
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.stall:
			<-make(chan struct{}) // hold the bytes until the test ends
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

func (p *stallProxy) addr() string { return p.l.Addr().String() }

// Keepalives go out on a live connection, and a peer that stops answering
// is dropped after KeepAliveMax of them instead of hanging the transfer;
// a connection reset during the handshake is a retryable error.
func TestKeepAliveAndReset(t *testing.T) {
	isolate(t)
	s := sshdtest.Start(t, sshdtest.SSHDConfig("LogLevel DEBUG1"))
	p := newStallProxy(t, s.Addr(), false)
	kh := writeFile(t, t.TempDir(), "known_hosts", knownhosts.Line([]string{knownhosts.Normalize(p.addr())}, s.HostKey)+"\n")
	o := Options{SSHConfigPath: "none", IdentityFiles: []string{s.ClientKeyPath}, KnownHostsPath: kh,
		// A second of keepalives unanswered: a loaded 2-core machine
		// (the whole suite at once) answered three in 150 ms too late.
		KeepAlive: 50 * time.Millisecond, KeepAliveMax: 20}
	c, err := dial(t, s.User+"@"+p.addr(), o)
	if err != nil {
		t.Fatal(err)
	}
	// sshd logs each keepalive it answers.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.Log(), "rtype keepalive@openssh.com want_reply 1") {
		if time.Now().After(deadline) {
			t.Fatalf("no keepalive reached sshd in 10 s:\n%s", s.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	mustWork(t, c) // answered keepalives keep it open

	close(p.stall)
	closed := make(chan error, 1)
	go func() { closed <- c.Wait() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("a stalled connection was still open 10 s after it stopped answering 50 ms keepalives")
	}

	p2 := newStallProxy(t, s.Addr(), true)
	_, err = dial(t, s.User+"@"+p2.addr(), o)
	if err == nil || errkind.Of(err) != errkind.Retryable || !strings.Contains(err.Error(), p2.addr()) {
		t.Fatalf("reset in the handshake: err = %v (kind %v), want retryable naming %s", err, errkind.Of(err), p2.addr())
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a reset waited for the timeout: %v", err)
	}
}
