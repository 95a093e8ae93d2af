package sshconn

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
)

// A config the way users write them: wildcards, negation, several
// patterns per Host, defaults at the end under Host *, Include of a
// directory of snippets, tokens.
const userConfig = `# my hosts
Host studio-a studio-b
    HostName %h.lan
    User ml
    IdentityFile ~/.ssh/id_studio

Host studio-?  !studio-c
    Port 2222
    IdentityFile %d/.ssh/id_%r_%h

Host gpu
    HostName 10.0.0.7
    ProxyJump bastion
    UserKnownHostsFile ~/.ssh/kh_gpu "/etc/with space/kh"

Host deep
    ProxyJump me@hop1:2200,ssh://hop2

Host direct
    ProxyJump none
    HostName direct.example

Match originalhost matched
    Port 1234

Match exec "false"
    Port 9

# Included for cond only: the Host * in it never matches another host
# (OpenSSH's SSHCONF_NEVERMATCH).
Host cond
    Include cond.conf

Host *.corp
    User corpuser

# An Include under Host *.corp would apply to *.corp only: Match all
# ends that section.
Match all
Include conf.d/*.conf

Host *
    User fallback
    Port 22
    IdentitiesOnly yes
    ServerAliveInterval 5
`

const snippet = `Host bastion
    HostName bastion.example
    User jump
Host hop1 hop2
    HostName %h.example
`

func TestResolve(t *testing.T) {
	home := isolate(t)
	ssh := filepath.Join(home, ".ssh")
	if err := os.MkdirAll(filepath.Join(ssh, "conf.d"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, ssh, "config", userConfig)
	writeFile(t, filepath.Join(ssh, "conf.d"), "jump.conf", snippet)
	writeFile(t, ssh, "cond.conf", "Port 4444\nHost *\n    User conduser\n")
	saved := systemConfig
	systemConfig = filepath.Join(home, "no-system-config")
	t.Cleanup(func() { systemConfig = saved })

	for _, tc := range []struct {
		host string
		want Endpoint
		jump []string // Jumps as user@host:port
	}{
		{host: "studio-a", want: Endpoint{Name: "studio-a", HostName: "studio-a.lan", Port: 2222, User: "ml",
			IdentityFiles: []string{ssh + "/id_studio", home + "/.ssh/id_ml_studio-a.lan"}}},
		// studio-c is excluded from the second block by !studio-c.
		{host: "studio-c", want: Endpoint{Name: "studio-c", HostName: "studio-c", Port: 22, User: "fallback"}},
		{host: "studio-b", want: Endpoint{Name: "studio-b", HostName: "studio-b.lan", Port: 2222, User: "ml",
			IdentityFiles: []string{ssh + "/id_studio", home + "/.ssh/id_ml_studio-b.lan"}}},
		{host: "gpu", want: Endpoint{Name: "gpu", HostName: "10.0.0.7", Port: 22, User: "fallback",
			KnownHostsFiles: []string{ssh + "/kh_gpu", "/etc/with space/kh", "/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"}},
			jump: []string{"jump@bastion.example:22 (bastion)"}},
		{host: "deep", want: Endpoint{Name: "deep", HostName: "deep", Port: 22, User: "fallback"},
			jump: []string{"me@hop1.example:2200 (hop1)", "fallback@hop2.example:22 (hop2)"}},
		{host: "direct", want: Endpoint{Name: "direct", HostName: "direct.example", Port: 22, User: "fallback"}},
		{host: "matched", want: Endpoint{Name: "matched", HostName: "matched", Port: 1234, User: "fallback"}},
		{host: "cond", want: Endpoint{Name: "cond", HostName: "cond", Port: 4444, User: "conduser"}},
		{host: "x.corp", want: Endpoint{Name: "x.corp", HostName: "x.corp", Port: 22, User: "corpuser"}},
		// Host patterns match case-insensitively.
		{host: "STUDIO-A", want: Endpoint{Name: "STUDIO-A", HostName: "STUDIO-A.lan", Port: 2222, User: "ml",
			IdentityFiles: []string{ssh + "/id_studio", home + "/.ssh/id_ml_STUDIO-A.lan"}}},
	} {
		t.Run(tc.host, func(t *testing.T) {
			e, err := Resolve(Target{Host: tc.host}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.IdentitiesOnly = true
			want.ServerAliveInterval = 5e9
			if want.KnownHostsFiles == nil {
				want.KnownHostsFiles = []string{ssh + "/known_hosts", ssh + "/known_hosts2", "/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"}
			}
			got := *e
			var jumps []string
			for _, j := range got.Jumps {
				jumps = append(jumps, j.String())
			}
			got.Jumps, got.Warnings = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Resolve(%s):\n got %+v\nwant %+v", tc.host, got, want)
			}
			if !reflect.DeepEqual(jumps, tc.jump) {
				t.Errorf("jumps %q, want %q", jumps, tc.jump)
			}
		})
	}

	// The command line wins over the config; Match exec is named in a
	// warning, not evaluated.
	e, err := Resolve(Target{User: "root", Host: "studio-a", Port: 22}, Options{IdentityFiles: []string{"~/k"}})
	if err != nil {
		t.Fatal(err)
	}
	if e.User != "root" || e.Port != 22 || e.IdentityFiles[0] != home+"/k" || e.IdentityFiles[2] != ssh+"/id_root_studio-a.lan" {
		t.Errorf("command line did not win: %+v", e)
	}
	if len(e.Warnings) != 1 || !strings.Contains(e.Warnings[0], "Match exec is not supported") || !strings.Contains(e.Warnings[0], "config:26") {
		t.Errorf("warnings %q, want one naming Match exec at config:26", e.Warnings)
	}
}

func TestResolveErrors(t *testing.T) {
	home := isolate(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name, config, host string
		kind               errkind.Kind
		want               string
	}{
		{"loop", "Host a\n ProxyJump b\nHost b\n ProxyJump a\n", "a", errkind.BadInput, "deeper than"},
		{"bad port", "Host a\n Port 99999\n", "a", errkind.BadInput, "config:2"},
		{"bad token", "Host a\n IdentityFile ~/id_%Z\n", "a", errkind.BadInput, "%Z"},
		{"proxycommand", "Host a\n ProxyCommand nc %h %p\n", "a", errkind.NotBuilt, "use ProxyJump"},
		{"unterminated quote", "Host a\n User \"x\n", "a", errkind.BadInput, "config: line 2"},
		{"selfinclude", "Include " + filepath.Join(dir, "selfinclude") + "\n", "a", errkind.BadInput, "nested deeper"},
		{"long line", "Host a\n User " + strings.Repeat("x", maxLineLen) + "\n", "a", errkind.BadInput, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, dir, tc.name, tc.config)
			if tc.name != "selfinclude" {
				p = writeFile(t, dir, "config", tc.config)
			}
			_, err := Resolve(Target{Host: tc.host}, Options{SSHConfigPath: p})
			if err == nil || errkind.Of(err) != tc.kind || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v (kind %v), want %v naming %q", err, errkind.Of(err), tc.kind, tc.want)
			}
		})
	}
	// A missing --ssh-config is bad input; a missing ~/.ssh/config is not
	// an error.
	if _, err := Resolve(Target{Host: "a"}, Options{SSHConfigPath: filepath.Join(home, "nope")}); !errors.Is(err, os.ErrNotExist) || errkind.Of(err) != errkind.BadInput {
		t.Errorf("missing --ssh-config: %v", err)
	}
	if _, err := Resolve(Target{Host: "a"}, Options{}); err != nil {
		t.Errorf("no ~/.ssh/config: %v", err)
	}
}
