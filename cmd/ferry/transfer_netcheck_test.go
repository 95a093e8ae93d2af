package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTransferNetcheck: ferry transfer runs netcheck before a byte goes
// to a destination. A failed requirement stops that destination before
// anything is written there, with the remedy, exit 3; --skip-netcheck
// sends anyway; an unknown --via interface is a usage error; --via an
// interface that has no route to the host fails the check.
func TestTransferNetcheck(t *testing.T) {
	s := startTransferSSHD(t)
	src := filepath.Join(t.TempDir(), "model.gguf")
	writeRandom(t, src, 300<<10, 7)
	state := t.TempDir()
	base := []string{"transfer", "--ssh-config", s.ConfigPath, "--state-dir", state}
	dstOf := func() (string, string) {
		d := filepath.Join(t.TempDir(), "dst")
		return d, s.Alias + ":" + d
	}
	nothingAt := func(t *testing.T, d string) {
		t.Helper()
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s exists after a failed netcheck (%v): something was sent", d, err)
		}
	}

	// The loopback's MTU is 65536: --expect-mtu 9000 fails before sending.
	d, dst := dstOf()
	r := execFerry(t, nil, append(base, "--expect-mtu", "9000", src, dst)...)
	if r.code != exitVerify || !strings.Contains(r.stderr, "lo MTU is 65536, --expect-mtu 9000: set it (ip link set lo mtu 9000") {
		t.Errorf("--expect-mtu 9000: exit %d, want %d with the remedy; stderr:\n%s", r.code, exitVerify, r.stderr)
	}
	nothingAt(t, d)

	// --skip-netcheck: the same transfer goes through.
	r = execFerry(t, nil, append(base, "--expect-mtu", "9000", "--skip-netcheck", src, dst)...)
	if r.code != exitOK {
		t.Fatalf("--skip-netcheck: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	if fi, err := os.Stat(filepath.Join(d, "model.gguf")); err != nil || fi.Size() != 300<<10 {
		t.Errorf("--skip-netcheck: %v %v, want the file sent", fi, err)
	}

	// Requirements that hold: the check runs and the transfer goes on.
	d, dst = dstOf()
	r = execFerry(t, nil, append(base, "--require-wired", "--expect-mtu", "65536", src, dst)...)
	if r.code != exitOK {
		t.Fatalf("--require-wired --expect-mtu 65536 to loopback: exit %d; stderr:\n%s", r.code, r.stderr)
	}

	// --via an interface this machine does not have: usage, exit 2.
	d, dst = dstOf()
	r = execFerry(t, nil, append(base, "--via", "nosuch0", src, dst)...)
	if r.code != exitBadInput || !strings.Contains(r.stderr, `interface "nosuch0"`) {
		t.Errorf("--via nosuch0: exit %d, want %d; stderr:\n%s", r.code, exitBadInput, r.stderr)
	}
	nothingAt(t, d)

	// --via an interface that does not carry 127.0.0.1 (any up interface
	// other than loopback; the kernel would send it by a default route
	// through it): the check fails, nothing is sent.
	other := ""
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagLoopback == 0 {
			other = i.Name
			break
		}
	}
	if other == "" {
		t.Logf("no up interface besides loopback: the --via refusal case is not run")
		return
	}
	d, dst = dstOf()
	r = execFerry(t, nil, append(base, "--via", other, src, dst)...)
	if r.code != exitVerify || !strings.Contains(r.stderr, "127.0.0.1) is this machine's own address, delivered by lo, not through "+other) {
		t.Errorf("--via %s: exit %d, want %d (no route through it); stderr:\n%s", other, r.code, exitVerify, r.stderr)
	}
	nothingAt(t, d)
}
