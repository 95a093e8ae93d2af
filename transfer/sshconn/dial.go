// Package sshconn opens SSH connections the way the user's own ssh would:
// through ~/.ssh/config (Host aliases, HostName, Port, User, IdentityFile,
// IdentitiesOnly, ProxyJump, UserKnownHostsFile, Include, Match …, read by
// this package's own bounded parser), with ssh-agent keys and identity
// files (a passphrase asked on the terminal, and only when the server
// accepts the key), and with known_hosts checked strictly: an unknown host
// is refused with its fingerprint and the command that trusts it, unless
// Options.AcceptNew (like StrictHostKeyChecking=accept-new); a changed key
// is always refused, naming the file and line of the old one.
//
// Connections prefer AES-GCM (hardware AES on amd64 and Apple silicon:
// ~620 MB/s against chacha20-poly1305's ~280 on amd64, where x/crypto's
// chacha20 is pure Go; ../shared/notes/transfer.md §8.2) and send
// keepalives. Errors carry internal/errkind kinds: a refused, reset or
// timed-out connection is Retryable; host-key problems (*HostKeyError,
// VerifyFailed) and authentication failures (*AuthError, Failure) are
// never retried.
//
// The command-line form of a remote place is ParseTarget's
// [user@]host[:port]:DIR; Resolve answers where a host is without
// connecting (netcheck uses it); Dial connects.
package sshconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// Options say how to connect; the zero value is ssh's defaults.
type Options struct {
	// SSHConfigPath is --ssh-config: only this file is read. "" reads
	// ~/.ssh/config then /etc/ssh/ssh_config (either may be missing);
	// "none" reads no config.
	SSHConfigPath string
	// KnownHostsPath is --known-hosts: the one known_hosts file, in place
	// of UserKnownHostsFile and the global files. --accept-new writes here.
	KnownHostsPath string
	// IdentityFiles are -i files, offered before the config's; a missing
	// one is an error.
	IdentityFiles []string
	// AcceptNew records the key of a host known_hosts does not know yet
	// (StrictHostKeyChecking=accept-new) instead of refusing it. A changed
	// key is refused all the same.
	AcceptNew bool
	// LocalAddr binds the first TCP connection (--via: the source address
	// of an interface); nil lets the kernel choose.
	LocalAddr *net.TCPAddr
	// Control is run on the first TCP connection's socket before it
	// connects (net.Dialer.Control): --via pins the socket to its
	// interface with it (netcheck.Binding.Control), which LocalAddr alone
	// does not do on Linux, where the route is chosen by destination.
	Control func(network, address string, c syscall.RawConn) error
	// Passphrase asks for an identity file's passphrase; nil asks on the
	// terminal (TerminalPassphrase) and fails clearly without one.
	Passphrase PassphraseFunc
	// Timeout bounds the TCP connect and the SSH handshake of each hop
	// (ConnectTimeout in the config wins); 0 means 30 s.
	Timeout time.Duration
	// KeepAlive is the interval between keepalive requests
	// (ServerAliveInterval in the config wins); 0 means 15 s, negative
	// disables. After KeepAliveMax unanswered ones in a row
	// (ServerAliveCountMax; 0 means 3) the connection is closed.
	KeepAlive    time.Duration
	KeepAliveMax int
}

// Ciphers is the cipher preference: AES-GCM first (AES-NI / ARMv8 AES),
// then chacha20-poly1305, then the CTR modes.
var Ciphers = []string{
	ssh.CipherAES128GCM, ssh.CipherAES256GCM, ssh.CipherChaCha20Poly1305,
	ssh.CipherAES128CTR, ssh.CipherAES192CTR, ssh.CipherAES256CTR,
}

// Dialer opens connections with one set of Options: the ssh_config is
// read once, and an encrypted identity file's passphrase is asked at most
// once, however many connections (streams, hosts) it opens, concurrently
// or not. Its methods are safe for concurrent use.
type Dialer struct {
	o  Options
	r  *resolver
	mu sync.Mutex
	// keys holds encrypted identity files once decrypted, by path.
	keys map[string]*unlockedKey
}

// NewDialer reads the ssh_config files o names.
func NewDialer(o Options) (*Dialer, error) {
	r, err := newResolver(o)
	if err != nil {
		return nil, err
	}
	return &Dialer{o: o, r: r, keys: map[string]*unlockedKey{}}, nil
}

func (d *Dialer) unlocked(path string) *unlockedKey {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := d.keys[path]
	if k == nil {
		k = &unlockedKey{}
		d.keys[path] = k
	}
	return k
}

// Resolve is the endpoint for t (see the package function Resolve).
func (d *Dialer) Resolve(t Target) (*Endpoint, error) { return d.r.resolve(t, 0, true) }

// Dial resolves t and connects, through its ProxyJump hosts if it has
// any. Closing the client closes the whole chain.
func (d *Dialer) Dial(ctx context.Context, t Target) (*ssh.Client, error) {
	e, err := d.Resolve(t)
	if err != nil {
		return nil, err
	}
	return d.DialEndpoint(ctx, e)
}

// DialEndpoint connects to a resolved endpoint (see Dial).
func (d *Dialer) DialEndpoint(ctx context.Context, e *Endpoint) (*ssh.Client, error) {
	var via *ssh.Client
	for i, j := range e.Jumps {
		var c *ssh.Client
		var err error
		if i == 0 {
			c, err = d.DialEndpoint(ctx, j)
		} else {
			c, err = d.hop(ctx, via, j)
		}
		if err != nil {
			if via != nil {
				via.Close()
			}
			return nil, fmt.Errorf("jump host %s: %w", j, err)
		}
		via = c
	}
	c, err := d.hop(ctx, via, e)
	if err != nil && via != nil {
		via.Close()
	}
	return c, err
}

// Dial connects to t with a Dialer of its own: for one connection. Open
// several through one Dialer.
func Dial(ctx context.Context, t Target, o Options) (*ssh.Client, error) {
	d, err := NewDialer(o)
	if err != nil {
		return nil, err
	}
	return d.Dial(ctx, t)
}

// hop opens a TCP connection to e, directly (via nil) or through via, and
// runs the SSH handshake on it.
func (d *Dialer) hop(ctx context.Context, via *ssh.Client, e *Endpoint) (*ssh.Client, error) {
	o := d.o
	timeout := o.Timeout
	if e.ConnectTimeout > 0 {
		timeout = e.ConnectTimeout
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	if o.LocalAddr != nil && o.LocalAddr.Port != 0 {
		return nil, errkind.Errorf(errkind.Usage, "LocalAddr %s: give an address with port 0", o.LocalAddr)
	}

	hk, err := newHostKeys(e, o.AcceptNew)
	if err != nil {
		return nil, err
	}
	a, err := newAuth(e, d)
	if err != nil {
		return nil, err
	}
	defer a.close()

	dialCtx, cancel := context.WithTimeout(ctx, timeout)
	var conn net.Conn
	if via == nil {
		nd := net.Dialer{LocalAddr: o.LocalAddr, Control: o.Control}
		conn, err = nd.DialContext(dialCtx, "tcp", e.Addr())
	} else {
		conn, err = via.DialContext(dialCtx, "tcp", e.Addr())
	}
	cancel()
	if err != nil {
		return nil, connError(ctx, e, err)
	}
	// The handshake takes no context: a deadline on the connection bounds
	// it, paused while a passphrase is asked (a person types it), and
	// cancelling ctx closes the connection.
	_ = conn.SetDeadline(time.Now().Add(timeout))
	a.pause = func(paused bool) {
		if paused {
			_ = conn.SetDeadline(time.Time{})
		} else {
			_ = conn.SetDeadline(time.Now().Add(timeout))
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	cfg := &ssh.ClientConfig{
		User:              e.User,
		Auth:              a.methods(),
		HostKeyCallback:   hk.check,
		HostKeyAlgorithms: hk.algorithms(),
		Config:            ssh.Config{Ciphers: Ciphers},
		ClientVersion:     "SSH-2.0-ferry",
	}
	cc, chans, reqs, err := ssh.NewClientConn(conn, e.Addr(), cfg)
	if !stop() {
		err = errors.Join(err, ctx.Err())
		if cc != nil {
			cc.Close()
		}
	}
	if err != nil {
		conn.Close()
		switch {
		case hk.err != nil:
			return nil, hk.err
		case a.signErr != nil:
			// An identity file the server accepts but that could not be
			// opened (no terminal for its passphrase, a wrong one).
			return nil, a.signErr
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, &AuthError{Endpoint: e.String(), Tried: append([]string(nil), a.tried...), Skipped: a.skipped, Err: err}
		}
		return nil, connError(ctx, e, err)
	}
	_ = conn.SetDeadline(time.Time{})
	client := ssh.NewClient(cc, chans, reqs)
	if via != nil {
		// Closing this client closes the jump connection under it.
		go func() { _ = client.Wait(); via.Close() }()
	}
	keepAlive(client, e, o)
	return client, nil
}

// connError classifies a failure to reach or talk to e: passing network
// trouble is Retryable; a name that does not resolve is BadInput.
func connError(ctx context.Context, e *Endpoint, err error) error {
	if ctx.Err() == context.Canceled {
		return fmt.Errorf("%s: %w", e, context.Canceled)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return errkind.Errorf(errkind.BadInput, "%s: host %q not found: %v (is it a Host alias in ssh_config?)", e, e.HostName, err)
	}
	if retryable(err) || ctx.Err() == context.DeadlineExceeded {
		return errkind.Errorf(errkind.Retryable, "%s: %w", e, err)
	}
	return fmt.Errorf("%s: %w", e, err)
}

// retryable reports network errors that may pass on their own.
func retryable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, os.ErrDeadlineExceeded):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	// Through a jump host, a refused forward is the remote's
	// "connect failed" (an *ssh.OpenChannelError).
	var oce *ssh.OpenChannelError
	return errors.As(err, &oce) && oce.Reason == ssh.ConnectionFailed
}

// keepAlive sends keepalive@openssh.com requests and closes the client
// after too many go unanswered, so a dead peer surfaces as an error
// instead of a hang.
func keepAlive(c *ssh.Client, e *Endpoint, o Options) {
	interval := o.KeepAlive
	if e.ServerAliveInterval > 0 {
		interval = e.ServerAliveInterval
	}
	if interval == 0 {
		interval = 15 * time.Second
	}
	if interval < 0 {
		return
	}
	limit := o.KeepAliveMax
	if e.ServerAliveCountMax > 0 {
		limit = e.ServerAliveCountMax
	}
	if limit <= 0 {
		limit = 3
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		var mu sync.Mutex
		missed := 0
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			mu.Lock()
			missed++
			if missed > limit {
				mu.Unlock()
				c.Close()
				return
			}
			mu.Unlock()
			go func() {
				// Any reply, even a refusal, shows the peer is alive.
				if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err == nil {
					mu.Lock()
					missed = 0
					mu.Unlock()
				}
			}()
		}
	}()
}
