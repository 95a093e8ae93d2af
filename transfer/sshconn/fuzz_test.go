package sshconn

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// FuzzConfig: any ssh_config either parses or is refused with an ssh_config
// error naming the file, and a parsed one resolves any host without
// panicking; what resolves has a port in range and a host name.
func FuzzConfig(f *testing.F) {
	f.Add([]byte(userConfig), "studio-a")
	f.Add([]byte(snippet), "hop1")
	f.Add([]byte("Host a\n ProxyJump b,c\nHost b\n ProxyJump a\n"), "a")
	f.Add([]byte("Match host x !user y\n Port=22\nHost *\n HostName %h.%%\n"), "x")
	f.Fuzz(func(t *testing.T, data []byte, host string) {
		c, err := parseConfig(bytes.NewReader(data), "fuzz.conf", "/home/u", true, false)
		if err != nil {
			if !errors.Is(err, ErrConfig) || !strings.HasPrefix(err.Error(), "fuzz.conf: ") {
				t.Fatalf("refusal is not an ssh_config error naming the file: %v", err)
			}
			return
		}
		d := &Dialer{r: &resolver{configs: []*Config{c}, home: "/home/u", localUser: "u"}, keys: map[string]*unlockedKey{}}
		tg, err := ParseHost(host)
		if err != nil {
			return
		}
		e, err := d.Resolve(tg)
		if err != nil {
			return
		}
		if e.Port < 1 || e.Port > 65535 || e.HostName == "" || e.User == "" && d.r.localUser != "" {
			t.Fatalf("resolved %q to %+v", host, e)
		}
	})
}

// FuzzTarget: ParseTarget never panics, and what it accepts prints back
// (String) to a form that parses to the same target.
func FuzzTarget(f *testing.F) {
	for _, s := range []string{"mac2:/m", "u@h:22:/d", "[::1]:/m", "u@[fe80::1%en0]:2200:/m", "h:", "a@b@h:x:y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseTarget(s)
		if err != nil {
			return
		}
		again, err := ParseTarget(tg.String())
		if err != nil || again != tg {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, tg, tg.String(), again, err)
		}
	})
}
