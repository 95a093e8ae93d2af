package pipeline

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
)

const varsSpec = `name: ${NAME}
store: ${STORE}
vars:
  NAME: v
  STORE: .ferry
  BASE: models/base
  REQ: "true"
  SRCS: [a, b]
  INJECT: x
stages:
  - name: a
    import: { path: "${BASE}/a" }
  - name: b
    import: { path: "${INJECT}" }
  - name: checked
    verify_mtp: { from: ["${SRCS}"], require: "${REQ}" }
  - name: lit
    import: { path: "$${BASE}" }
`

func TestVars(t *testing.T) {
	tests := []struct {
		name              string
		vars              map[string]string
		pipeName, storeIs string
		aPath, bPath      string
		from              []string
		require           bool
		source            string // of BASE
	}{
		{name: "defaults", pipeName: "v", storeIs: "/p/.ferry", aPath: "/p/models/base/a", bPath: "/p/x",
			from: []string{"a", "b"}, require: true, source: "default"},
		{name: "overrides", vars: map[string]string{"BASE": "/m", "NAME": "w", "REQ": "false", "SRCS": "b, a,lit", "STORE": "/s"},
			pipeName: "w", storeIs: "/s", aPath: "/m/a", bPath: "/p/x", from: []string{"b", "a", "lit"}, source: "--var"},
		// A value is a value: YAML in it stays text.
		{name: "no injection", vars: map[string]string{"INJECT": "q }\n  - name: evil\n    import: { path: /etc"},
			pipeName: "v", storeIs: "/p/.ferry", aPath: "/p/models/base/a",
			bPath: "/p/q }\n  - name: evil\n    import: { path: /etc", from: []string{"a", "b"}, require: true, source: "default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("v.yaml", "/p", []byte(varsSpec), WithVars(tt.vars))
			if err != nil {
				t.Fatal(err)
			}
			if s.Name != tt.pipeName || s.Store != tt.storeIs || len(s.Stages) != 4 {
				t.Fatalf("name %q store %q, %d stages", s.Name, s.Store, len(s.Stages))
			}
			if p := s.Lookup("a").Stage.(*importStage).Path; p != tt.aPath {
				t.Errorf("a: path %q, want %q", p, tt.aPath)
			}
			if p := s.Lookup("b").Stage.(*importStage).Path; p != tt.bPath {
				t.Errorf("b: path %q, want %q", p, tt.bPath)
			}
			if p := s.Lookup("lit").Stage.(*importStage).Path; p != "/p/${BASE}" {
				t.Errorf("$${ gave %q", p)
			}
			c := s.Lookup("checked")
			v := c.Stage.(*verifyMTPStage)
			if !reflect.DeepEqual(v.From, tt.from) || v.Require != tt.require {
				t.Errorf("checked: %+v", v)
			}
			for i, d := range c.Deps {
				if d.Line != 16 || d.Name != tt.from[i] {
					t.Errorf("dep %d: %+v (want line 16)", i, d)
				}
			}
			for _, vr := range s.Vars {
				if vr.Name == "BASE" && vr.Source != tt.source {
					t.Errorf("BASE source %q", vr.Source)
				}
			}
		})
	}
}

// A variable reaches the stage key only through the value it produces.
func TestVarsKeyIsTheValue(t *testing.T) {
	plain := "name: k\nstages:\n  - name: a\n    import: { path: /m/base }\n"
	withVar := "name: k\nvars: { B: /m/other }\nstages:\n  - name: a\n    import: { path: \"${B}\" }\n"
	key := func(src string, vars map[string]string) string {
		s, err := Parse("k.yaml", "/p", []byte(src), WithVars(vars))
		if err != nil {
			t.Fatal(err)
		}
		k, _, _, err := newRunner(s, nil, Options{}).key(s.Stages[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if a, b := key(plain, nil), key(withVar, map[string]string{"B": "/m/base"}); a != b {
		t.Errorf("same path, different keys: %s %s", a, b)
	}
	if a, b := key(plain, nil), key(withVar, nil); a == b {
		t.Error("different paths, same key")
	}
}

// Every mistake is found before anything runs, names the variable and the
// line, and exits 2.
func TestVarsBad(t *testing.T) {
	const stages = "stages:\n  - name: a\n    import: { path: %s }\n"
	tests := []struct {
		name  string
		src   string
		vars  map[string]string
		line  int // 0: a usage error (the command line), not a line of the file
		msg   string
		usage bool
	}{
		{"unset", "name: x\nvars:\n  BASE:\n" + strings.Replace(stages, "%s", `"${BASE}"`, 1), nil, 6, "variable ${BASE} is not set: give --var BASE=VALUE", false},
		{"undeclared", "name: x\n" + strings.Replace(stages, "%s", `"a/${NOPE}"`, 1), nil, 4, "variable ${NOPE} is not declared", false},
		{"unknown --var", "name: x\nvars: { BASE: b }\n" + strings.Replace(stages, "%s", `"${BASE}"`, 1), map[string]string{"BSAE": "/m"}, 0, "--var BSAE: x.yaml declares no such variable (declared: BASE)", true},
		{"--var without vars", "name: x\n" + strings.Replace(stages, "%s", "p", 1), map[string]string{"A": "1"}, 0, "declares no such variable (declared: none", true},
		{"list in a scalar", "name: x\nvars: { L: [a, b] }\n" + strings.Replace(stages, "%s", `"${L}"`, 1), nil, 5, "${L} is a list (line 2)", false},
		{"two lists", "name: x\nvars: { L: [a], M: [b] }\nstages:\n  - name: a\n    verify_mtp: { from: [\"${L}${M}\"] }\n", nil, 5, "two list variables", false},
		{"key", "name: x\nvars: { K: path }\nstages:\n  - name: a\n    import: { \"${K}\": p }\n", nil, 5, "not in keys", false},
		{"unterminated", "name: x\n" + strings.Replace(stages, "%s", "\"${A\"", 1), nil, 4, "unterminated", false},
		{"bad name", "name: x\n" + strings.Replace(stages, "%s", "\"${A-B}\"", 1), nil, 4, "bad variable reference ${A-B}", false},
		{"bad declaration", "name: x\nvars: { 1A: b }\n" + strings.Replace(stages, "%s", "p", 1), nil, 2, "variable name \"1A\"", false},
		{"vars not a mapping", "name: x\nvars: [A]\n" + strings.Replace(stages, "%s", "p", 1), nil, 2, "vars must be a mapping", false},
		{"nested default", "name: x\nvars: { A: { b: c } }\n" + strings.Replace(stages, "%s", "p", 1), nil, 2, "a default is a string or a list", false},
		{"empty list value", "name: x\nvars: { L: [a] }\nstages:\n  - name: a\n    verify_mtp: { from: [\"${L}\"] }\n", map[string]string{"L": "a,,b"}, 0, "comma-separated non-empty values", true},
		{"required list", "name: x\nvars: { L: [] }\nstages:\n  - name: a\n    verify_mtp: { from: [\"${L}\"] }\n", nil, 5, "${L} is not set", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.yaml", "/p", []byte(tt.src), WithVars(tt.vars))
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %v, want %q", err, tt.msg)
			}
			var se *SpecError
			switch {
			case tt.usage && errkind.Of(err) != errkind.Usage:
				t.Errorf("%v: kind %v, want usage", err, errkind.Of(err))
			case !tt.usage && (!errors.As(err, &se) || se.Line != tt.line):
				t.Errorf("%v: want a SpecError at line %d", err, tt.line)
			}
		})
	}
}

func TestParseVarFlag(t *testing.T) {
	if k, v, err := ParseVarFlag("HOSTS=a,b=c"); err != nil || k != "HOSTS" || v != "a,b=c" {
		t.Errorf("%q %q %v", k, v, err)
	}
	for _, bad := range []string{"A", "=v", "1A=v", "A B=v"} {
		if _, _, err := ParseVarFlag(bad); errkind.Of(err) != errkind.Usage {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// A list variable repeats items; what that makes is bounded.
func TestVarsExpansionBound(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: x\nvars:\n  L:\n")
	for i := 0; i < 10; i++ {
		b.WriteString("    - " + strings.Repeat("a", 60000) + "\n")
	}
	b.WriteString("stages:\n  - name: a\n    verify_mtp:\n      from:\n")
	for i := 0; i < 20; i++ {
		b.WriteString("        - ${L}\n")
	}
	_, err := Parse("x.yaml", "/p", []byte(b.String()))
	var se *SpecError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "over 8388608 bytes") {
		t.Fatalf("got %v", err)
	}
}

func TestParamDiff(t *testing.T) {
	tests := []struct{ a, b, want string }{
		{`{"bits":4,"group_size":64}`, `{"bits":6,"group_size":64}`, ": bits 4 -> 6"},
		{`{"bits":4}`, `{"bits":4,"recipe":"mixed_3_6"}`, `: recipe (none) -> "mixed_3_6"`},
		{`{"to":["a:/x","b:/x"],"z":1}`, `{"to":["a:/x"]}`, `: to ["a:/x","b:/x"] -> ["a:/x"], z 1 -> (none)`},
		{`{"a":1}`, `{"a":1}`, ""},
		{`{"p":"` + strings.Repeat("x", 100) + `"}`, `{"p":"y"}`, `: p "` + strings.Repeat("x", 56) + `... -> "y"`},
	}
	for _, tt := range tests {
		if got := paramDiff([]byte(tt.a), []byte(tt.b)); got != tt.want {
			t.Errorf("%s vs %s: %q, want %q", tt.a, tt.b, got, tt.want)
		}
	}
}
