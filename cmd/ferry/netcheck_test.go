package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNetcheckCLI: exit codes and output of ferry netcheck on this
// machine's loopback (the network-namespace cases are in package
// netcheck).
func TestNetcheckCLI(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "ssh_config")
	os.WriteFile(cfg, []byte("Host studio\n  HostName 127.0.0.1\n  Port 2222\n  User ml\n"+
		"Host behind\n  HostName 10.0.0.2\n  ProxyJump bastion\nHost bastion\n  HostName 127.0.0.1\n  Port 2200\n"), 0o644)
	runCLICases(t, []cliCase{
		{"loopback", []string{"netcheck", "--ssh-config", "none", "127.0.0.1"}, exitOK, []string{"127.0.0.1", "this machine's own address", "path MTU", "default routes", "ok: every check passed"}},
		{"user@host:dir as transfer takes it", []string{"netcheck", "--ssh-config", "none", "me@127.0.0.1:/models"}, exitOK, []string{"127.0.0.1"}},
		{"ssh_config alias", []string{"netcheck", "--ssh-config", cfg, "studio:/models"}, exitOK, []string{"studio (127.0.0.1) port 2222", "tcp/2222"}},
		{"ProxyJump: the first hop is checked", []string{"netcheck", "--ssh-config", cfg, "behind"}, exitOK, []string{"behind, first hop bastion (127.0.0.1) port 2200"}},
		{"port on the command line", []string{"netcheck", "--ssh-config", cfg, "studio:2223"}, exitOK, []string{"studio (127.0.0.1) port 2223"}},
		{"no host", []string{"netcheck"}, exitBadInput, []string{"needs at least one HOST"}},
		{"bad --expect-mtu", []string{"netcheck", "--ssh-config", "none", "--expect-mtu", "10", "127.0.0.1"}, exitBadInput, []string{"at least 68"}},
		{"unknown interface", []string{"netcheck", "--ssh-config", "none", "--via", "nosuch0", "127.0.0.1"}, exitBadInput, []string{`interface "nosuch0"`}},
		// "a..b" is not a domain name: the resolver refuses it without a query.
		{"unknown host", []string{"netcheck", "--ssh-config", "none", "a..b"}, exitBadInput, []string{"unknown host a..b"}},
	})

	out, code, err := runFerry(t, "netcheck", "--ssh-config", "none", "--json", "127.0.0.1")
	if code != exitOK {
		t.Fatalf("--json: exit %d (%v)\n%s", code, err, out)
	}
	var rep struct {
		OK    bool `json:"ok"`
		Hosts []struct {
			Addr  string `json:"addr"`
			Route struct {
				Local bool `json:"local"`
			} `json:"route"`
			PathMTU struct {
				MTU int `json:"mtu"`
			} `json:"path_mtu"`
		} `json:"hosts"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if !rep.OK || len(rep.Hosts) != 1 || rep.Hosts[0].Addr != "127.0.0.1" || !rep.Hosts[0].Route.Local || rep.Hosts[0].PathMTU.MTU < 1280 {
		t.Errorf("--json report = %+v", rep)
	}
}

// cliCase is one run of the CLI: its arguments, the exit code it must end
// with and substrings its output (or error) must hold.
type cliCase struct {
	name string
	args []string
	code int
	want []string
}

func runCLICases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code, err := runFerry(t, c.args...)
			if code != c.code {
				t.Fatalf("exit %d (%v), want %d\n%s", code, err, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) && (err == nil || !strings.Contains(err.Error(), w)) {
					t.Errorf("output lacks %q:\n%s\nerr: %v", w, out, err)
				}
			}
		})
	}
}
