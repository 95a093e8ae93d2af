package sshconn

import (
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
)

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
		err  bool
	}{
		{in: "mac2:/models/x", want: Target{Host: "mac2", Dir: "/models/x"}},
		{in: "me@mac2:/models", want: Target{User: "me", Host: "mac2", Dir: "/models"}},
		{in: "me@mac2:2222:/models", want: Target{User: "me", Host: "mac2", Port: 2222, Dir: "/models"}},
		{in: "mac2:", want: Target{Host: "mac2"}},
		{in: "mac2:models/x", want: Target{Host: "mac2", Dir: "models/x"}},
		{in: "mac2:123", want: Target{Host: "mac2", Dir: "123"}},         // a directory named 123
		{in: "mac2:22:", want: Target{Host: "mac2", Port: 22}},           // port, home directory
		{in: "mac2:~/m:odd", want: Target{Host: "mac2", Dir: "~/m:odd"}}, // colons in the path stay
		{in: "10.0.0.2:/m", want: Target{Host: "10.0.0.2", Dir: "/m"}},
		{in: "[::1]:/m", want: Target{Host: "::1", Dir: "/m"}},
		{in: "u@[fe80::1%en0]:2200:/m", want: Target{User: "u", Host: "fe80::1%en0", Port: 2200, Dir: "/m"}},
		{in: "a@b@host:/m", want: Target{User: "a@b", Host: "host", Dir: "/m"}},
		{in: "/local/path", err: true},
		{in: "host", err: true},
		{in: ":/m", err: true},
		{in: "@host:/m", err: true},
		{in: "[::1/m", err: true},
		{in: "[::1]/m", err: true},
		{in: "[notip]:/m", err: true},
		{in: "host:0:/m", err: true},
		{in: "host:70000:/m", err: true},
		{in: "-oProxyCommand=x:/m", err: true},
		{in: "ho st:/m", err: true},
	} {
		got, err := ParseTarget(tc.in)
		if tc.err {
			if err == nil {
				t.Errorf("ParseTarget(%q) = %+v, want an error", tc.in, got)
			} else if errkind.Of(err) != errkind.Usage {
				t.Errorf("ParseTarget(%q): kind %v, want usage", tc.in, errkind.Of(err))
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		// String gives back a form that parses to the same target.
		if again, err := ParseTarget(got.String()); err != nil || again != got {
			t.Errorf("ParseTarget(%q).String() = %q, which parses to %+v, %v", tc.in, got.String(), again, err)
		}
	}
}

func TestParseHost(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
		err  bool
	}{
		{in: "mac2", want: Target{Host: "mac2"}},
		{in: "me@mac2:2222", want: Target{User: "me", Host: "mac2", Port: 2222}},
		{in: "[::1]:22", want: Target{Host: "::1", Port: 22}},
		{in: "::1", want: Target{Host: "::1"}},
		{in: "fe80::1%eth0", want: Target{Host: "fe80::1%eth0"}},
		{in: "[::1]", want: Target{Host: "::1"}},
		{in: "mac2:", err: true},
		{in: "mac2:x", err: true},
		{in: "a:b:c", err: true},
		{in: "", err: true},
		{in: "[::1]x", err: true},
	} {
		got, err := ParseHost(tc.in)
		if tc.err != (err != nil) || got != tc.want {
			t.Errorf("ParseHost(%q) = %+v, %v; want %+v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestLooksRemote(t *testing.T) {
	for in, want := range map[string]bool{
		"host:/x": true, "u@h:": true, "[::1]:/x": true, "h:2222:/x": true,
		"./a:b": false, "/x/y:z": false, "file": false, ":x": false, "dir/a:b": false,
	} {
		if got := LooksRemote(in); got != want {
			t.Errorf("LooksRemote(%q) = %v, want %v", in, got, want)
		}
	}
}
