package pipeline

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/errkind"
)

const goodSpec = `name: demo
store: .ferry
stages:
  - name: base
    import: { path: models/base }
  - name: adapter
    import: { path: ~/adapters/a }
  - name: merged
    merge: { base: base, adapter: adapter }
    out: out/merged
`

func TestParseGood(t *testing.T) {
	s, err := Parse("demo.yaml", "/p", []byte(goodSpec))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "demo" || s.Store != "/p/.ferry" || len(s.Stages) != 3 {
		t.Fatalf("%+v", s)
	}
	m := s.Lookup("merged")
	if m.Kind != "merge" || m.Out != "/p/out/merged" || len(m.Deps) != 2 || m.Deps[0].Name != "base" || m.Deps[0].Line != 9 {
		t.Fatalf("merged: %+v", m)
	}
	if got := s.Lookup("base").Stage.(*importStage).Path; got != "/p/models/base" {
		t.Errorf("base path %q", got)
	}
	if got := s.Lookup("adapter").Stage.(*importStage).Path; strings.HasPrefix(got, "~") || !strings.HasSuffix(got, "/adapters/a") {
		t.Errorf("~ not expanded: %q", got)
	}
	if v := s.ViewDir(s.Lookup("base")); v != "/p/.ferry/views/base" {
		t.Errorf("default view %q", v)
	}
}

// Every bad file gives one error, with the line it is about, exit 2.
func TestParseBad(t *testing.T) {
	tests := []struct {
		name string
		src  string
		line int
		msg  string
	}{
		{"bad yaml", "name: x\nstages:\n  - name: a\n    import: { path: p\n", 4, "invalid YAML"},
		{"bad yaml indent", "name: x\nstages:\n  - name: a\n    import: { path: p }\n   bad: indent\n", 5, "invalid YAML"},
		{"bad yaml unclosed list", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: b\n    verify_mtp: { from: [a, b }\n  - name: c\n", 6, "invalid YAML"},
		{"bad yaml tab", "name: x\n\tstages: []\n", 2, "invalid YAML"},
		{"unknown kind", "name: x\nstages:\n  - name: a\n    imprt: { path: p }\n", 4, `unknown kind "imprt"`},
		{"missing reference", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: b\n    verify_mtp: { from: nope }\n", 6, `unknown stage "nope"`},
		{"missing reference in list", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: c\n    verify_mtp:\n      from:\n        - a\n        - zz\n", 9, `unknown stage "zz"`},
		{"cycle", "name: x\nstages:\n  - name: a\n    verify_mtp: { from: b }\n  - name: b\n    verify_mtp: { from: a }\n", 6, "dependency cycle: a -> b -> a"},
		{"self cycle", "name: x\nstages:\n  - name: a\n    verify_mtp: { from: a }\n", 4, "dependency cycle: a -> a"},
		{"duplicate name", "name: x\nstages:\n  - name: a\n    import: { path: p }\n  - name: a\n    import: { path: q }\n", 5, "duplicate stage name (first defined at line 3)"},
		{"two kinds", "name: x\nstages:\n  - name: a\n    import: { path: p }\n    verify_mtp: { from: b }\n", 5, "exactly one kind"},
		{"no kind", "name: x\nstages:\n  - name: a\n    out: o\n", 3, "no kind given"},
		{"no name", "name: x\nstages:\n  - import: { path: p }\n", 3, "stage without a name"},
		{"unknown param", "name: x\nstages:\n  - name: a\n    import:\n      path: p\n      pth: q\n", 6, `unknown parameter "pth"`},
		{"missing param", "name: x\nstages:\n  - name: a\n    import: {}\n", 4, `needs "path"`},
		{"unknown top key", "name: x\nstage: []\n", 2, `unknown key "stage"`},
		{"no stages", "name: x\nstages: []\n", 2, "no stages"},
		{"missing name", "stages:\n  - name: a\n    import: { path: p }\n", 1, "missing name"},
		{"empty", "", 1, "empty file"},
		{"not a mapping", "- a\n- b\n", 1, "must be a mapping"},
		{"stages not a list", "name: x\nstages: { a: 1 }\n", 2, "stages must be a list"},
		{"bad stage name", "name: x\nstages:\n  - name: 'a b'\n    import: { path: p }\n", 3, "stage name must be"},
		{"params not mapping", "name: x\nstages:\n  - name: a\n    import: [p]\n", 4, "must be a mapping"},
		{"shared out", "name: x\nstages:\n  - name: a\n    import: { path: p }\n    out: o\n  - name: b\n    import: { path: q }\n    out: o\n", 8, "overlaps the view of stage \"a\""},
		{"nested out", "name: x\nstages:\n  - name: a\n    import: { path: p }\n    out: o\n  - name: b\n    import: { path: q }\n    out: o/b\n", 8, "overlaps the view"},
		{"out holds the store", "name: x\nstages:\n  - name: a\n    import: { path: p }\n    out: .\n", 5, "overlaps the store"},
		{"ref not a name", "name: x\nstages:\n  - name: a\n    verify_mtp: { from: [a, [2]] }\n", 4, "every item must be"},
		{"ref not single", "name: x\nstages:\n  - name: a\n    merge: { base: [a], adapter: a }\n", 4, "merge.base: must be a single value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", "/d", []byte(tc.src))
			var se *SpecError
			if !errors.As(err, &se) {
				t.Fatalf("err %v (%T), want *SpecError", err, err)
			}
			if se.Line != tc.line {
				t.Errorf("line %d, want %d (%v)", se.Line, tc.line, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), "p.yaml:") || !errors.Is(err, ErrSpec) || errkind.Of(se) != errkind.BadInput {
				t.Errorf("error %q: want file:line prefix, ErrSpec, BadInput", err)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"10": 10, "1KB": 1000, "2 MiB": 2 << 20, "3GB": 3e9, "0": 0} {
		if got, ok := ParseSize(in); !ok || got != want {
			t.Errorf("%q: %d %v", in, got, ok)
		}
	}
	for _, bad := range []string{"", "x", "-1", "1TB", "99999999999GiB"} {
		if _, ok := ParseSize(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzSpec: any bytes give a Spec or a *SpecError with a line, never a
// panic; with a vars: block, variables are substituted first.
func FuzzSpec(f *testing.F) {
	f.Add([]byte(goodSpec))
	f.Add([]byte("name: x\nstages:\n  - name: a\n    verify_mtp: { from: b }\n  - name: b\n    verify_mtp: { from: a }\n"))
	f.Add([]byte("name: x\nstages:\n  - name: a\n    import: { path: p\n"))
	f.Add([]byte("&a [*a]"))
	f.Add([]byte(varsSpec))
	f.Add([]byte("name: x\nvars: { L: [a, b], S: &s s }\nstages:\n  - name: a\n    verify_mtp: { from: [\"${L}-$${S}\", *s, \"${S}\"] }\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse("f.yaml", "/d", b)
		if err != nil {
			var se *SpecError
			if errors.As(err, &se) && se.Line < 1 {
				t.Fatalf("error without a line: %v", err)
			}
			return
		}
		if len(s.Order()) != len(s.Stages) {
			t.Fatal("order lost stages")
		}
	})
}

// store: s3://BUCKET/PREFIX is a shared store with a local cache under
// the user cache directory (one per URL); another scheme is not built,
// said with its line; lease_ttl is checked; a directory whose name has a
// colon stays a directory.
func TestParseObjectStore(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache")
	for _, tc := range []struct {
		store, extra string
		shared       string
		cache        string
		ttl          time.Duration
		err          string
		notBuilt     bool
	}{
		{store: "s3://bucket/prefix", shared: "s3://bucket/prefix", cache: "/cache/ferry/stores/bucket_prefix-"},
		{store: "s3://bucket", extra: "lease_ttl: 30s\n", shared: "s3://bucket", cache: "/cache/ferry/stores/bucket-", ttl: 30 * time.Second},
		{store: "s3://bucket", extra: "lease_ttl: 1ms\n", err: "p.yaml:3: lease_ttl must be a duration of at least 100ms"},
		{store: "s3://", err: "p.yaml:2: store: "},
		{store: "file:///srv/ferry", shared: "file:///srv/ferry", cache: "/cache/ferry/stores/srv_ferry-"},
		{store: "file://srv/ferry", err: "p.yaml:2: store file://srv/ferry: want file:///ABSOLUTE/DIR"},
		{store: "gs://bucket/p", err: "p.yaml:2: store gs://bucket/p: a pipeline on a gs:// store is not built", notBuilt: true},
	} {
		spec, err := Parse("p.yaml", "/d", []byte("name: x\nstore: "+tc.store+"\n"+tc.extra+"stages:\n  - name: a\n    import: { path: p }\n"))
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) || errors.Is(err, errkind.ErrNotBuilt) != tc.notBuilt {
				t.Errorf("%s %s: %v, want %q", tc.store, tc.extra, err, tc.err)
			}
			continue
		}
		if err != nil || spec.Shared != tc.shared || !strings.HasPrefix(spec.Store, tc.cache) || spec.LeaseTTL != tc.ttl {
			t.Errorf("%s %s: %v, shared %q cache %q ttl %v", tc.store, tc.extra, err, spec.Shared, spec.Store, spec.LeaseTTL)
			continue
		}
		if err := spec.UseCache("/elsewhere/c"); err != nil || spec.Store != "/elsewhere/c" {
			t.Errorf("UseCache: %v, %q", err, spec.Store)
		}
	}
	if spec, err := Parse("p.yaml", "/d", []byte("name: x\nstore: s3://b/p\ncache_max: 200GB\nstages:\n  - name: a\n    import: { path: p }\n")); err != nil || spec.CacheMax != 200e9 {
		t.Errorf("cache_max: %v", err)
	}
	if _, err := Parse("p.yaml", "/d", []byte("name: x\ncache_max: lots\nstages:\n  - name: a\n    import: { path: p }\n")); err == nil || !strings.HasPrefix(err.Error(), "p.yaml:2: cache_max must be a size") {
		t.Errorf("cache_max: lots: %v", err)
	}
	if spec, err := Parse("p.yaml", "/d", []byte("name: x\nstages:\n  - name: a\n    import: { path: p }\n")); err != nil || spec.UseCache("/c") == nil {
		t.Errorf("--cache on a local store must be refused: %v", err)
	}
	spec, err := Parse("p.yaml", "/d", []byte("name: x\nstore: ./a://b\nstages:\n  - name: a\n    import: { path: p }\n"))
	if err != nil || spec.Store != "/d/a:/b" {
		t.Errorf("a directory named with a colon: %v, %+v", err, spec)
	}
}
