package sshdtest

import (
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func clientConfig(t *testing.T, s *Server) *ssh.ClientConfig {
	t.Helper()
	cb, err := knownhosts.New(s.KnownHostsPath)
	if err != nil {
		t.Fatal(err)
	}
	return &ssh.ClientConfig{User: s.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(s.ClientKey)},
		HostKeyCallback: cb, Timeout: 10 * time.Second}
}

// The server runs commands for the generated client key, checked against
// the known_hosts file it wrote, and goes away on Stop.
func TestStart(t *testing.T) {
	s := Start(t)
	c, err := ssh.Dial("tcp", s.Addr(), clientConfig(t, s))
	if err != nil {
		t.Fatalf("dial %s: %v\nsshd log:\n%s", s.Addr(), err, s.Log())
	}
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := sess.Output("echo ok")
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("exec: %q, %v", out, err)
	}
	// The SFTP subsystem is served in-process (internal-sftp).
	sess, err = c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestSubsystem("sftp"); err != nil {
		t.Fatalf("sftp subsystem: %v", err)
	}
	sess.Close()
	c.Close()

	s.Stop()
	if conn, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts after Stop", s.Addr())
	}
}

// OpenSSH's own client accepts the ssh_config and known_hosts Start
// writes: the alias resolves, the host key is known, the key is authorized.
func TestOpenSSHClientUsesConfig(t *testing.T) {
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		t.Skip("LOUD SKIP: no OpenSSH client (ssh) on PATH; apt-get install openssh-client")
	}
	s := Start(t, Alias("box"))
	// The sftp subsystem (internal-sftp) answers without starting the
	// user's login shell, whose rc files can take seconds; it ends at
	// EOF on stdin, exit 0.
	cmd := exec.Command(sshBin, "-F", s.ConfigPath, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "box", "-s", "sftp")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(s.Log(), "Accepted publickey for "+s.User) {
		t.Fatalf("ssh -F %s box -s sftp: %v\n%s\nsshd log:\n%s", s.ConfigPath, err, out, s.Log())
	}
}

// SSHDConfig lines override the defaults: with no authorized keys file
// the client key is refused.
func TestSSHDConfigOverrides(t *testing.T) {
	s := Start(t, SSHDConfig("AuthorizedKeysFile none"))
	_, err := ssh.Dial("tcp", s.Addr(), clientConfig(t, s))
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("dial with keys refused: err = %v, want an authentication failure", err)
	}
}
