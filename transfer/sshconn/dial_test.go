package sshconn

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/sshdtest"
)

// isolate keeps the machine's own ssh setup out of a test: HOME is an
// empty directory (no ~/.ssh/config, no default identities, no
// known_hosts) and no agent.
func isolate(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("SSH_AUTH_SOCK", "")
	return home
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// mustWork checks that c is an authenticated connection that serves
// channels: it opens a session and the SFTP subsystem (served inside
// sshd, so no login shell runs).
func mustWork(t *testing.T, c *ssh.Client) {
	t.Helper()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	defer sess.Close()
	if err := sess.RequestSubsystem("sftp"); err != nil {
		t.Fatalf("sftp subsystem: %v", err)
	}
}

func dial(t *testing.T, target string, o Options) (*ssh.Client, error) {
	t.Helper()
	tg, err := ParseHost(target)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, tg, o)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// One server, many ways to reach it and be refused by it.
func TestDial(t *testing.T) {
	home := isolate(t)
	s := sshdtest.Start(t)
	port := strconv.Itoa(s.Port)

	t.Run("alias from the written config", func(t *testing.T) {
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath})
		if err != nil {
			t.Fatalf("Dial %s: %v", s.Alias, err)
		}
		mustWork(t, c)
	})

	t.Run("explicit identity and known_hosts, no config", func(t *testing.T) {
		c, err := dial(t, s.User+"@127.0.0.1:"+port, Options{SSHConfigPath: "none",
			IdentityFiles: []string{s.ClientKeyPath}, KnownHostsPath: s.KnownHostsPath})
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		mustWork(t, c)
	})

	t.Run("socket control (--via pins the interface with it)", func(t *testing.T) {
		var got []string
		ctl := func(network, address string, c syscall.RawConn) error {
			got = append(got, network+" "+address)
			return nil
		}
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, Control: ctl})
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		mustWork(t, c)
		if want := "tcp4 " + s.Addr(); len(got) != 1 || got[0] != want {
			t.Errorf("Control ran for %q, want once for %q", got, want)
		}
		refuse := errors.New("interface gone")
		_, err = dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, Control: func(string, string, syscall.RawConn) error { return refuse }})
		if !errors.Is(err, refuse) {
			t.Errorf("Dial with a failing Control: %v, want its error", err)
		}
	})

	t.Run("source address", func(t *testing.T) {
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}})
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		if got := c.LocalAddr().(*net.TCPAddr).IP; !got.Equal(net.IPv4(127, 0, 0, 1)) {
			t.Errorf("local address %v, want 127.0.0.1", got)
		}
	})

	t.Run("unknown host refused with fingerprint and command", func(t *testing.T) {
		kh := filepath.Join(t.TempDir(), "known_hosts") // does not exist
		_, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
		var he *HostKeyError
		if !errors.As(err, &he) || !errors.Is(err, ErrHostKeyUnknown) {
			t.Fatalf("err = %v, want an unknown host key", err)
		}
		msg := err.Error()
		for _, want := range []string{ssh.FingerprintSHA256(s.HostKey), "ssh-keyscan -p " + port + " -t ed25519 127.0.0.1 >> " + kh, "--accept-new"} {
			if !strings.Contains(msg, want) {
				t.Errorf("message lacks %q:\n%s", want, msg)
			}
		}
		if k := errkind.Of(err); k != errkind.VerifyFailed {
			t.Errorf("kind %v, want %v", k, errkind.VerifyFailed)
		}
		if _, err := os.Stat(kh); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused host wrote %s (%v)", kh, err)
		}
		// The command the message gives works: run it, and the host is known.
		_, cmd, _ := strings.Cut(msg, "trust it with: ")
		cmd, _, _ = strings.Cut(cmd, "   (or")
		if _, err := exec.LookPath("ssh-keyscan"); err != nil {
			t.Skip("LOUD SKIP: no ssh-keyscan (openssh-client) to run the suggested command")
		}
		if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
		if err != nil {
			t.Fatalf("Dial after %s: %v", cmd, err)
		}
		mustWork(t, c)
	})

	t.Run("StrictHostKeyChecking no is only a hint", func(t *testing.T) {
		dir := t.TempDir()
		cfg := writeFile(t, dir, "config", s.HostBlock("lax", "StrictHostKeyChecking no", "UserKnownHostsFile "+filepath.Join(dir, "kh")))
		_, err := dial(t, "lax", Options{SSHConfigPath: cfg})
		if !errors.Is(err, ErrHostKeyUnknown) || !strings.Contains(err.Error(), "StrictHostKeyChecking no is not followed") {
			t.Fatalf("err = %v, want an unknown host saying StrictHostKeyChecking is not followed", err)
		}
	})

	t.Run("accept-new records the key, then it is known", func(t *testing.T) {
		kh := filepath.Join(t.TempDir(), "sub", "known_hosts")
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh, AcceptNew: true})
		if err != nil {
			t.Fatalf("Dial --accept-new: %v", err)
		}
		mustWork(t, c)
		b, err := os.ReadFile(kh)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(b), s.KnownHostsLine()+"\n"; got != want {
			t.Errorf("known_hosts:\n%q\nwant\n%q", got, want)
		}
		// Known now: a strict dial succeeds and the file is unchanged.
		if _, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh}); err != nil {
			t.Fatalf("second Dial: %v", err)
		}
		if b2, _ := os.ReadFile(kh); string(b2) != string(b) {
			t.Errorf("second dial changed known_hosts:\n%s", b2)
		}
	})

	t.Run("changed key refused even with accept-new", func(t *testing.T) {
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		otherPub, _ := ssh.NewPublicKey(other.Public())
		dir := t.TempDir()
		kh := writeFile(t, dir, "known_hosts", "# a comment\notherhost "+string(ssh.MarshalAuthorizedKey(otherPub))+
			knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, otherPub)+"\n")
		_, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh, AcceptNew: true})
		if !errors.Is(err, ErrHostKeyChanged) {
			t.Fatalf("err = %v, want a changed host key", err)
		}
		for _, want := range []string{kh + ":3", ssh.FingerprintSHA256(s.HostKey), ssh.FingerprintSHA256(otherPub)} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message lacks %q:\n%v", want, err)
			}
		}
		if b, _ := os.ReadFile(kh); strings.Count(string(b), "\n") != 3 {
			t.Errorf("a refused key changed known_hosts:\n%s", b)
		}
	})

	t.Run("hashed known_hosts entry", func(t *testing.T) {
		kh := writeFile(t, t.TempDir(), "known_hosts",
			knownhosts.Line([]string{knownhosts.HashHostname(knownhosts.Normalize(s.Addr()))}, s.HostKey)+"\n")
		c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
		if err != nil {
			t.Fatalf("Dial with a hashed entry: %v", err)
		}
		mustWork(t, c)
	})

	t.Run("unauthorized key: auth failure names host and user", func(t *testing.T) {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		p := filepath.Join(t.TempDir(), "id_other")
		if _, err := sshdtest.WriteKey(p, k, nil); err != nil {
			t.Fatal(err)
		}
		_, err := dial(t, s.User+"@127.0.0.1:"+port, Options{SSHConfigPath: "none",
			IdentityFiles: []string{p}, KnownHostsPath: s.KnownHostsPath})
		if !errors.Is(err, ErrAuth) {
			t.Fatalf("err = %v, want an authentication failure", err)
		}
		for _, want := range []string{s.User + "@127.0.0.1:" + port, p} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message lacks %q:\n%v", want, err)
			}
		}
		if k := errkind.Of(err); k == errkind.Retryable {
			t.Errorf("an auth failure is %v", k)
		}
	})

	t.Run("unusable configured identity is skipped and named", func(t *testing.T) {
		dir := t.TempDir()
		pubOnly := writeFile(t, dir, "id.pub", string(ssh.MarshalAuthorizedKey(s.ClientKey.PublicKey())))
		cfg := writeFile(t, dir, "config", "Host box\n HostName 127.0.0.1\n Port "+port+"\n User "+s.User+
			"\n IdentityFile "+pubOnly+"\n IdentityFile "+s.ClientKeyPath+"\n UserKnownHostsFile "+s.KnownHostsPath+"\n")
		c, err := dial(t, "box", Options{SSHConfigPath: cfg})
		if err != nil {
			t.Fatalf("a public key as IdentityFile stopped the dial: %v", err)
		}
		mustWork(t, c)
		// Alone, it is named in the failure.
		cfg = writeFile(t, dir, "config1", "Host box\n HostName 127.0.0.1\n Port "+port+"\n User "+s.User+
			"\n IdentityFile "+pubOnly+"\n UserKnownHostsFile "+s.KnownHostsPath+"\n")
		_, err = dial(t, "box", Options{SSHConfigPath: cfg})
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "identity file "+pubOnly+" not used") {
			t.Fatalf("err = %v, want an auth failure naming the unusable identity file", err)
		}
	})

	t.Run("missing -i file is bad input", func(t *testing.T) {
		_, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, IdentityFiles: []string{filepath.Join(home, "nope")}})
		if err == nil || errkind.Of(err) != errkind.BadInput || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("err = %v (kind %v), want bad input naming the file", err, errkind.Of(err))
		}
	})
}

// Nothing listens: the refusal is a retryable error naming the host.
func TestDialRefused(t *testing.T) {
	isolate(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = dial(t, "root@"+addr, Options{SSHConfigPath: "none"})
	if err == nil || errkind.Of(err) != errkind.Retryable || !strings.Contains(err.Error(), addr) {
		t.Fatalf("err = %v (kind %v), want a retryable refusal naming %s", err, errkind.Of(err), addr)
	}
}

// Keys in an agent (x/crypto's keyring served on a unix socket, spoken to
// through SSH_AUTH_SOCK) authenticate.
func TestDialAgent(t *testing.T) {
	isolate(t)
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	pub, _ := ssh.NewPublicKey(k.Public())
	s := sshdtest.Start(t, sshdtest.Authorize(pub))
	sock := serveAgent(t, k)
	t.Setenv("SSH_AUTH_SOCK", sock)
	// Only the agent holds an authorized key: IdentityFile none.
	cfg := writeFile(t, t.TempDir(), "config", "Host box\n HostName 127.0.0.1\n Port "+strconv.Itoa(s.Port)+
		"\n User "+s.User+"\n UserKnownHostsFile "+s.KnownHostsPath+"\n")
	c, err := dial(t, "box", Options{SSHConfigPath: cfg})
	if err != nil {
		t.Fatalf("Dial with the agent: %v", err)
	}
	mustWork(t, c)

	// IdentitiesOnly: the agent's key is not offered when no identity
	// file names it.
	only := writeFile(t, t.TempDir(), "config", "Host box\n HostName 127.0.0.1\n Port "+strconv.Itoa(s.Port)+
		"\n User "+s.User+"\n UserKnownHostsFile "+s.KnownHostsPath+"\n IdentitiesOnly yes\n IdentityFile ~/.ssh/none\n")
	if _, err := dial(t, "box", Options{SSHConfigPath: only}); !errors.Is(err, ErrAuth) {
		t.Fatalf("IdentitiesOnly with the key only in the agent: err = %v, want an auth failure", err)
	}
}

func serveAgent(t *testing.T, keys ...ed25519.PrivateKey) string {
	t.Helper()
	kr := agent.NewKeyring()
	for _, k := range keys {
		if err := kr.Add(agent.AddedKey{PrivateKey: k}); err != nil {
			t.Fatal(err)
		}
	}
	// A short path: unix socket names are limited to ~100 bytes.
	dir, err := os.MkdirTemp("", "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _ = agent.ServeAgent(kr, c); c.Close() }()
		}
	}()
	return sock
}

// A host reachable only through another: ProxyJump in the config, each
// hop resolved through the config, closing the client closes the chain.
func TestDialProxyJump(t *testing.T) {
	isolate(t)
	// DEBUG1 logs each forwarded connection: the proof that a hop went
	// through the jump host.
	jump := sshdtest.Start(t, sshdtest.SSHDConfig("LogLevel DEBUG1"))
	target := sshdtest.Start(t)
	kh := writeFile(t, t.TempDir(), "known_hosts", jump.KnownHostsLine()+"\n"+target.KnownHostsLine()+"\n")
	cfg := writeFile(t, t.TempDir(), "config",
		jump.HostBlock("jump", "UserKnownHostsFile "+kh)+
			target.HostBlock("target", "ProxyJump jump", "UserKnownHostsFile "+kh)+
			target.HostBlock("twice", "ProxyJump jump,jump2", "UserKnownHostsFile "+kh)+
			jump.HostBlock("jump2", "UserKnownHostsFile "+kh))
	forwarded := func(port int) int {
		return strings.Count(jump.Log(), "server_request_direct_tcpip: originator 0.0.0.0 port 0, target 127.0.0.1 port "+strconv.Itoa(port)+"\n")
	}
	for _, tc := range []struct {
		host   string
		toJump int // forwards through jump to jump2 (the same sshd)
	}{{"target", 0}, {"twice", 1}} {
		t.Run(tc.host, func(t *testing.T) {
			before, beforeJ := forwarded(target.Port), forwarded(jump.Port)
			c, err := dial(t, tc.host, Options{SSHConfigPath: cfg})
			if err != nil {
				t.Fatalf("Dial %s: %v\njump log:\n%s", tc.host, err, jump.Log())
			}
			mustWork(t, c)
			if n := forwarded(target.Port) - before; n != 1 {
				t.Errorf("the jump host forwarded %d connections to the target, want 1:\n%s", n, jump.Log())
			}
			if n := forwarded(jump.Port) - beforeJ; n != tc.toJump {
				t.Errorf("the jump host forwarded %d connections to itself (jump2), want %d", n, tc.toJump)
			}
			// AES-GCM is negotiated first (Ciphers).
			if !strings.Contains(jump.Log(), "kex: client->server cipher: aes128-gcm@openssh.com") {
				t.Errorf("the jump host did not negotiate aes128-gcm:\n%s", jump.Log())
			}
		})
	}

	// A jump host that refuses us: the error names the jump host.
	bad := writeFile(t, t.TempDir(), "config",
		"Host jump\n HostName 127.0.0.1\n Port "+strconv.Itoa(jump.Port)+"\n User "+jump.User+"\n IdentityFile none\n UserKnownHostsFile "+kh+"\n"+
			target.HostBlock("target", "ProxyJump jump", "UserKnownHostsFile "+kh))
	_, err := dial(t, "target", Options{SSHConfigPath: bad})
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "jump host") {
		t.Fatalf("err = %v, want an auth failure at the jump host", err)
	}
}

// A passphrase-protected identity file the server accepts: asked on the
// terminal (a real pseudo-terminal here), or through Options.Passphrase;
// with no terminal the error says what to do.
func TestDialPassphrase(t *testing.T) {
	isolate(t)
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	keyPath := filepath.Join(t.TempDir(), "id_locked")
	pub, err := sshdtest.WriteKey(keyPath, k, []byte("open sesame"))
	if err != nil {
		t.Fatal(err)
	}
	s := sshdtest.Start(t, sshdtest.Authorize(pub))
	opts := func() Options {
		return Options{SSHConfigPath: "none", KnownHostsPath: s.KnownHostsPath, IdentityFiles: []string{keyPath}}
	}
	target := s.User + "@" + s.Addr()
	saved := terminalPath
	t.Cleanup(func() { terminalPath = saved })

	t.Run("no terminal", func(t *testing.T) {
		terminalPath = writeFile(t, t.TempDir(), "not-a-tty", "")
		_, err := dial(t, target, opts())
		if !errors.Is(err, ErrPassphrase) {
			t.Fatalf("err = %v, want ErrPassphrase", err)
		}
		for _, want := range []string{keyPath, "no terminal", "ssh-add " + keyPath, s.Addr()} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("message lacks %q:\n%v", want, err)
			}
		}
	})

	t.Run("hook", func(t *testing.T) {
		o := opts()
		var asked []string
		o.Passphrase = func(prompt string) ([]byte, error) {
			asked = append(asked, prompt)
			return []byte("open sesame"), nil
		}
		c, err := dial(t, target, o)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		mustWork(t, c)
		if len(asked) != 1 || !strings.Contains(asked[0], keyPath) {
			t.Errorf("asked %q, want one prompt naming %s", asked, keyPath)
		}
		o.Passphrase = func(string) ([]byte, error) { return []byte("wrong"), nil }
		if _, err := dial(t, target, o); !errors.Is(err, ErrPassphrase) || !strings.Contains(err.Error(), "wrong passphrase") {
			t.Errorf("wrong passphrase: err = %v", err)
		}
	})

	// The handshake's timeout does not run while a person types.
	t.Run("slower than the timeout", func(t *testing.T) {
		o := opts()
		o.Timeout = time.Second
		o.Passphrase = func(string) ([]byte, error) {
			time.Sleep(o.Timeout * 3 / 2)
			return []byte("open sesame"), nil
		}
		c, err := dial(t, target, o)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		mustWork(t, c)
	})

	t.Run("terminal", func(t *testing.T) {
		testTerminalPassphrase(t, func() {
			c, err := dial(t, target, opts())
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			mustWork(t, c)
		}, "open sesame")
	})

	// The agent holds the key: no passphrase is asked.
	t.Run("agent first", func(t *testing.T) {
		t.Setenv("SSH_AUTH_SOCK", serveAgent(t, k))
		o := opts()
		o.Passphrase = func(string) ([]byte, error) { t.Error("asked for a passphrase"); return nil, ErrPassphrase }
		c, err := dial(t, target, o)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		mustWork(t, c)
	})
}

// Streams: one Dialer opening several connections at once asks for a
// passphrase once and records a new host key once (the known_hosts
// append is locked and re-checked), hashed when the config says
// HashKnownHosts yes.
func TestDialerConcurrent(t *testing.T) {
	isolate(t)
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	keyPath := filepath.Join(t.TempDir(), "id_locked")
	pub, err := sshdtest.WriteKey(keyPath, k, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	s := sshdtest.Start(t, sshdtest.Authorize(pub))
	kh := filepath.Join(t.TempDir(), "known_hosts")
	cfg := writeFile(t, t.TempDir(), "config", "Host box\n HostName 127.0.0.1\n Port "+strconv.Itoa(s.Port)+
		"\n User "+s.User+"\n IdentityFile "+keyPath+"\n HashKnownHosts yes\n")
	var mu sync.Mutex
	asked := 0
	d, err := NewDialer(Options{SSHConfigPath: cfg, KnownHostsPath: kh, AcceptNew: true,
		Passphrase: func(string) ([]byte, error) {
			mu.Lock()
			asked++
			mu.Unlock()
			return []byte("pw"), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	const streams = 4
	errs := make(chan error, streams)
	for range streams {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := d.Dial(ctx, Target{Host: "box"})
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Errorf("Dial: %v", err)
		}
	}
	if asked != 1 {
		t.Errorf("asked for the passphrase %d times, want 1", asked)
	}
	b, err := os.ReadFile(kh)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "|1|") {
		t.Fatalf("known_hosts after %d concurrent --accept-new dials:\n%s\nwant one hashed line", streams, b)
	}
	// The hashed line is OpenSSH's: ssh-keygen finds the host in it.
	if keygen, err := exec.LookPath("ssh-keygen"); err == nil {
		out, err := exec.Command(keygen, "-F", "["+"127.0.0.1"+"]:"+strconv.Itoa(s.Port), "-f", kh).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "|1|") {
			t.Errorf("ssh-keygen -F does not find the host in the line we wrote: %v\n%s", err, out)
		}
	}
}

// A server with an ed25519 and an ECDSA host key, and known_hosts holding
// only one of them: the handshake asks for the known one, instead of
// taking the library's first preference (ECDSA) and calling the host's
// key changed (golang/go#29286).
func TestDialKnownKeyType(t *testing.T) {
	isolate(t)
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s := sshdtest.Start(t, sshdtest.ExtraHostKey(ec))
	for i, k := range s.HostKeys {
		t.Run(k.Type(), func(t *testing.T) {
			kh := writeFile(t, t.TempDir(), "known_hosts", knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, s.HostKeys[i])+"\n")
			c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
			if err != nil {
				t.Fatalf("Dial with only the %s key known: %v", k.Type(), err)
			}
			mustWork(t, c)
		})
	}
}

// @revoked refuses the key, naming the line, even with --accept-new.
func TestDialRevoked(t *testing.T) {
	isolate(t)
	s := sshdtest.Start(t)
	kh := writeFile(t, t.TempDir(), "known_hosts", s.KnownHostsLine()+"\n@revoked * "+string(ssh.MarshalAuthorizedKey(s.HostKey)))
	_, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh, AcceptNew: true})
	if !errors.Is(err, ErrHostKeyRevoked) || !strings.Contains(err.Error(), kh+":2") || errkind.Of(err) != errkind.VerifyFailed {
		t.Fatalf("err = %v, want a revoked key naming %s:2", err, kh)
	}
}

// A host certificate: trusted through @cert-authority without the host
// key itself being known; with another CA it falls back to the plain key,
// known or not, as OpenSSH does.
func TestDialCertAuthority(t *testing.T) {
	isolate(t)
	_, caKey, _ := ed25519.GenerateKey(rand.Reader)
	ca, _ := ssh.NewSignerFromKey(caKey)
	_, hostKey, _ := ed25519.GenerateKey(rand.Reader)
	hostPub, _ := ssh.NewPublicKey(hostKey.Public())
	cert := &ssh.Certificate{Key: hostPub, CertType: ssh.HostCert, KeyId: "sshconn-test",
		ValidPrincipals: []string{"127.0.0.1"}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	certPath := writeFile(t, t.TempDir(), "host-cert.pub", string(ssh.MarshalAuthorizedKey(cert)))
	s := sshdtest.Start(t, sshdtest.HostKey(hostKey), sshdtest.SSHDConfig("HostCertificate "+certPath))
	_, otherCA, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _ := ssh.NewPublicKey(otherCA.Public())
	dir := t.TempDir()
	// x/crypto's knownhosts reads a pattern without [ ]:port as port 22
	// only (OpenSSH matches * against "[host]:port" too): name the port.
	pattern := "[127.0.0.1]:" + strconv.Itoa(s.Port)

	kh := writeFile(t, dir, "ca", "@cert-authority "+pattern+" "+string(ssh.MarshalAuthorizedKey(ca.PublicKey())))
	c, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
	if err != nil {
		t.Fatalf("Dial trusting the CA: %v", err)
	}
	mustWork(t, c)

	kh = writeFile(t, dir, "other-ca", "@cert-authority "+pattern+" "+string(ssh.MarshalAuthorizedKey(otherPub)))
	_, err = dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh})
	if !errors.Is(err, ErrHostKeyUnknown) || !strings.Contains(err.Error(), ssh.FingerprintSHA256(hostPub)) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("another CA: err = %v, want the plain host key unknown, named by its fingerprint, with the certificate mentioned", err)
	}

	// --accept-new records the plain key beside the other CA's line.
	if _, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh, AcceptNew: true}); err != nil {
		t.Fatalf("another CA, --accept-new: %v", err)
	}
	if _, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh}); err != nil {
		t.Fatalf("another CA, after --accept-new: %v", err)
	}

	kh = writeFile(t, dir, "other-ca+plain", "@cert-authority "+pattern+" "+string(ssh.MarshalAuthorizedKey(otherPub))+s.KnownHostsLine()+"\n")
	if _, err := dial(t, s.Alias, Options{SSHConfigPath: s.ConfigPath, KnownHostsPath: kh}); err != nil {
		t.Fatalf("another CA, plain key known: %v", err)
	}
}
