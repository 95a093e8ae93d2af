// Package sshdtest starts a real OpenSSH sshd for tests: on 127.0.0.1 at a
// free port, as the current user, with an ed25519 host key and an ed25519
// client key generated in t.TempDir(), and stops it when the test ends.
// Beside the server it writes what a client needs: an ssh_config with a
// Host alias for it, a known_hosts file holding its host key, and the
// client's private key.
//
// sshd needs an absolute path (it re-executes itself) and, as root, its
// privilege-separation directory (/run/sshd on Debian, which only the
// service's init script creates); Start creates that directory when sshd
// names it missing. Where sshd cannot be found or started the test is
// skipped with the reason, except under CI=true, where it fails: .ci/run
// installs openssh-server, so a skip there would hide a broken setup.
//
// An exec request runs the user's shell, which reads its rc files (bash
// reads ~/.bashrc under sshd): a heavy one (pyenv init) costs seconds per
// command. Tests that only need a working channel open the sftp subsystem,
// served inside sshd (internal-sftp), which starts no shell.
package sshdtest

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Server is a running sshd.
type Server struct {
	Port  int    // the TCP port on 127.0.0.1
	User  string // the user it accepts (the current user)
	Alias string // the Host alias ConfigPath names it by

	Dir            string // the server's temporary directory
	ConfigPath     string // client ssh_config: Host Alias → 127.0.0.1, Port, User, IdentityFile
	KnownHostsPath string // known_hosts with HostKey for [127.0.0.1]:Port
	ClientKeyPath  string // the client's private key (OpenSSH format, no passphrase)
	SSHDConfigPath string // the sshd_config sshd runs with

	HostKey   ssh.PublicKey   // the server's host key (ed25519)
	HostKeys  []ssh.PublicKey // all its host keys: HostKey, then those of ExtraHostKey
	ClientKey ssh.Signer      // the key in ClientKeyPath, authorized on the server

	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when sshd has exited
	stop sync.Once
}

// Option changes how Start sets the server up.
type Option func(*settings)

type settings struct {
	alias      string
	sshdLines  []string
	authorized []ssh.PublicKey
	hostKey    ed25519.PrivateKey
	extraKeys  []crypto.Signer
	sftp       string
}

// SFTPServer makes cmd (run by the user's shell) the sftp subsystem
// instead of sshd's in-process internal-sftp: an external sftp-server,
// or one behind a wrapper that records what the client sends.
func SFTPServer(cmd string) Option { return func(s *settings) { s.sftp = cmd } }

// Alias names the server in the client ssh_config (default "sshdtest").
func Alias(name string) Option { return func(s *settings) { s.alias = name } }

// SSHDConfig adds sshd_config lines. They come before the defaults, and
// sshd keeps the first value it reads for a keyword, so they override
// them: SSHDConfig("AuthorizedKeysFile none") refuses every key.
func SSHDConfig(lines ...string) Option {
	return func(s *settings) { s.sshdLines = append(s.sshdLines, lines...) }
}

// Authorize authorizes more client keys (an agent's, a passphrase-protected
// one's) beside the generated ClientKey.
func Authorize(keys ...ssh.PublicKey) Option {
	return func(s *settings) { s.authorized = append(s.authorized, keys...) }
}

// HostKey makes the server use this ed25519 host key instead of a new one
// (two servers, one key; or a restart with the same identity).
func HostKey(k ed25519.PrivateKey) Option { return func(s *settings) { s.hostKey = k } }

// ExtraHostKey gives the server another host key (an ECDSA or RSA one),
// offered beside the ed25519 one: a client then negotiates which one it
// is shown.
func ExtraHostKey(k crypto.Signer) Option {
	return func(s *settings) { s.extraKeys = append(s.extraKeys, k) }
}

// Addr is "127.0.0.1:Port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// Pid is the process id of the listening sshd. The sessions it serves
// run in its descendants, whose CPU time adds to its children's
// (/proc/PID/stat cutime and cstime) once they have ended and been reaped:
// what a benchmark counts as the server's CPU.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Log is what sshd has written to its stderr so far (-e: its log).
func (s *Server) Log() string { return s.log.String() }

// HostBlock is the client ssh_config block for the server under the name
// host, with extra lines ("ProxyJump other", ...) first so they win. Tests
// that write their own config put several servers' blocks in one file.
func (s *Server) HostBlock(host string, extra ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Host %s\n", host)
	for _, l := range extra {
		fmt.Fprintf(&b, "    %s\n", l)
	}
	fmt.Fprintf(&b, "    HostName 127.0.0.1\n    Port %d\n    User %s\n    IdentityFile %s\n    IdentitiesOnly yes\n    UserKnownHostsFile %s\n",
		s.Port, s.User, s.ClientKeyPath, s.KnownHostsPath)
	return b.String()
}

// KnownHostsLine is the known_hosts line for the server's ed25519 host
// key (the known_hosts file Start writes holds this line only).
func (s *Server) KnownHostsLine() string {
	return knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, s.HostKey)
}

// Stop ends the listening sshd (SIGTERM to its process group, SIGKILL
// after 5 s) and waits for it; it refuses new connections from then on.
// Sessions already open are served by children that sshd put in sessions
// of their own (setsid), and end when their clients disconnect. Stop runs
// at the end of the test anyway.
func (s *Server) Stop() {
	s.stop.Do(func() {
		pgid := s.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-s.done
		}
	})
}

// Find returns the absolute path of sshd, or an error saying how to get it.
func Find() (string, error) {
	if p, err := exec.LookPath("sshd"); err == nil && filepath.IsAbs(p) {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd", "/opt/homebrew/sbin/sshd"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("no sshd on PATH or in /usr/sbin, /usr/local/sbin (Debian: apt-get install openssh-server)")
}

// unavailable skips the test, or fails it under CI=true.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := "sshdtest: OpenSSH sshd unavailable, SSH tests NOT RUN: " + fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: .ci/run installs openssh-server, so this is a failure)")
	}
	t.Skip(msg)
}

// Start starts sshd and returns it running, with its banner read.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	set := settings{alias: "sshdtest"}
	for _, o := range opts {
		o(&set)
	}
	bin, err := Find()
	if err != nil {
		unavailable(t, "%v", err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatalf("sshdtest: current user: %v", err)
	}
	dir := t.TempDir()
	s := &Server{User: u.Username, Alias: set.alias, Dir: dir,
		ConfigPath:     filepath.Join(dir, "ssh_config"),
		KnownHostsPath: filepath.Join(dir, "known_hosts"),
		ClientKeyPath:  filepath.Join(dir, "id_ed25519"),
		SSHDConfigPath: filepath.Join(dir, "sshd_config"),
	}
	hostKeyPath := filepath.Join(dir, "ssh_host_ed25519_key")
	hk := set.hostKey
	if hk == nil {
		_, hk, _ = ed25519.GenerateKey(rand.Reader)
	}
	if s.HostKey, err = WriteKey(hostKeyPath, hk, nil); err != nil {
		t.Fatal(err)
	}
	s.HostKeys = []ssh.PublicKey{s.HostKey}
	hostKeyPaths := []string{hostKeyPath}
	for i, k := range set.extraKeys {
		p := filepath.Join(dir, fmt.Sprintf("ssh_host_extra%d_key", i))
		pub, err := WriteKey(p, k, nil)
		if err != nil {
			t.Fatalf("sshdtest: extra host key: %v", err)
		}
		s.HostKeys = append(s.HostKeys, pub)
		hostKeyPaths = append(hostKeyPaths, p)
	}
	_, ck, _ := ed25519.GenerateKey(rand.Reader)
	if _, err = WriteKey(s.ClientKeyPath, ck, nil); err != nil {
		t.Fatal(err)
	}
	if s.ClientKey, err = ssh.NewSignerFromKey(ck); err != nil {
		t.Fatal(err)
	}
	var ak bytes.Buffer
	for _, k := range append([]ssh.PublicKey{s.ClientKey.PublicKey()}, set.authorized...) {
		ak.Write(ssh.MarshalAuthorizedKey(k))
	}
	akPath := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(akPath, ak.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	// A free port can be taken between our probe and sshd's bind: try a
	// few times.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("sshdtest: no free port on 127.0.0.1: %v", err)
		}
		s.Port = port
		cfg := sshdConfig(&set, s, hostKeyPaths, akPath)
		if err := os.WriteFile(s.SSHDConfigPath, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		lastErr = s.run(t, bin)
		if lastErr == nil {
			break
		}
		if !strings.Contains(lastErr.Error(), "Address already in use") {
			break
		}
	}
	if lastErr != nil {
		unavailable(t, "%s: %v", bin, lastErr)
	}
	if err := os.WriteFile(s.ConfigPath, []byte(s.HostBlock(s.Alias)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.KnownHostsPath, []byte(s.KnownHostsLine()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func sshdConfig(set *settings, s *Server, hostKeyPaths []string, akPath string) string {
	var b strings.Builder
	for _, l := range set.sshdLines {
		b.WriteString(l + "\n")
	}
	for _, p := range hostKeyPaths {
		b.WriteString("HostKey " + p + "\n")
	}
	// MaxStartups and MaxSessions are high so that parallel streams (many
	// connections, many channels each) are not throttled by the server.
	fmt.Fprintf(&b, `ListenAddress 127.0.0.1:%d
AuthorizedKeysFile %s
PidFile %s
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
MaxStartups 256
MaxSessions 256
LogLevel VERBOSE
Subsystem sftp %s
`, s.Port, akPath, filepath.Join(s.Dir, "sshd.pid"), cmp.Or(set.sftp, "internal-sftp"))
	return b.String()
}

// privsepMissing matches sshd's complaint about its chroot directory.
var privsepMissing = regexp.MustCompile(`Missing privilege separation directory: (\S+)`)

// run starts sshd and waits for its banner; on failure sshd is gone.
func (s *Server) run(t testing.TB, bin string) error {
	for try := 0; ; try++ {
		err := s.start(t, bin)
		if err == nil {
			return nil
		}
		m := privsepMissing.FindStringSubmatch(err.Error())
		if m == nil || try > 0 || os.Geteuid() != 0 {
			return err
		}
		// As root sshd chroots its unprivileged child into this empty
		// directory; Debian's service creates it at boot, a container
		// without init has none.
		if mkErr := os.MkdirAll(m[1], 0o755); mkErr != nil {
			return fmt.Errorf("%w (and creating %s failed: %v)", err, m[1], mkErr)
		}
	}
}

func (s *Server) start(t testing.TB, bin string) error {
	s.log = &syncBuffer{}
	s.done = make(chan struct{})
	s.stop = sync.Once{}
	cmd := exec.Command(bin, "-D", "-e", "-f", s.SSHDConfigPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			s.log.WriteString(line + "\n")
			if strings.HasPrefix(line, "Server listening on") {
				once.Do(func() { close(listening) })
			}
		}
		_ = cmd.Wait()
		close(s.done)
	}()
	select {
	case <-listening:
	case <-s.done:
		return fmt.Errorf("sshd exited at start (%v): %s", cmd.ProcessState, strings.TrimSpace(s.log.String()))
	case <-time.After(20 * time.Second):
		s.Stop()
		return fmt.Errorf("sshd did not listen within 20 s: %s", strings.TrimSpace(s.log.String()))
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", s.Addr(), s.Log())
		}
	})
	// The port accepts and speaks SSH: read the banner.
	if err := readBanner(s.Addr()); err != nil {
		s.Stop()
		return err
	}
	return nil
}

func readBanner(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return fmt.Errorf("sshd listening but %s refuses: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	banner, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(banner, "SSH-2.0-") {
		return fmt.Errorf("no SSH banner from %s (%q, %v)", addr, banner, err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WriteKey writes k (ed25519.PrivateKey, *ecdsa.PrivateKey,
// *rsa.PrivateKey) as an OpenSSH private key file (mode 0600), encrypted
// with passphrase when it is not empty, and returns its public key: for
// tests of identity files.
func WriteKey(path string, k crypto.Signer, passphrase []byte) (ssh.PublicKey, error) {
	var blk *pem.Block
	var err error
	if len(passphrase) == 0 {
		blk, err = ssh.MarshalPrivateKey(k, "sshdtest")
	} else {
		blk, err = ssh.MarshalPrivateKeyWithPassphrase(k, "sshdtest", passphrase)
	}
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
		return nil, err
	}
	return ssh.NewPublicKey(k.Public())
}

// syncBuffer is a bytes.Buffer safe for one writer and many readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) WriteString(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.WriteString(s)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
