package main

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

// `ferry version` prints what --version and -v print; with --json the same
// facts as one object; arguments are a usage error.
func TestVersionCommand(t *testing.T) {
	want := "ferry version " + releaseVersion + " (build " + version + ")\n"
	for _, args := range [][]string{{"--version"}, {"-v"}, {"version"}} {
		r := execFerry(t, nil, args...)
		if r.code != exitOK || r.stdout != want {
			t.Errorf("ferry %s: exit %d, stdout %q, want exit 0 and %q (stderr %q)", strings.Join(args, " "), r.code, r.stdout, want, r.stderr)
		}
	}

	r := execFerry(t, nil, "version", "--json")
	if r.code != exitOK {
		t.Fatalf("ferry version --json: exit %d: %s", r.code, r.stderr)
	}
	var got versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("ferry version --json: %v\n%s", err, r.stdout)
	}
	if w := (versionInfo{Name: "ferry", Version: releaseVersion, Build: version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}); got != w {
		t.Errorf("ferry version --json: %+v, want %+v", got, w)
	}

	for _, args := range [][]string{{"version", "extra"}, {"version", "--bogus"}} {
		r := execFerry(t, nil, args...)
		if r.code != exitBadInput || r.stdout != "" {
			t.Errorf("ferry %s: exit %d, stdout %q; want exit 2 and nothing printed (stderr %q)", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
}
