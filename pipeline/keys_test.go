package pipeline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/pipeline/pipelinetest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// Two shapes of one kind's params: the same fields in another order, at
// every level, and one more omitempty field at its zero value.
type paramsA struct {
	X     int64  `json:"x"`
	Y     string `json:"y"`
	Inner struct {
		B int64 `json:"b"`
		A int64 `json:"a"`
	} `json:"inner"`
}

type paramsB struct {
	Inner struct {
		A int64 `json:"a"`
		B int64 `json:"b"`
	} `json:"inner"`
	New bool   `json:"new,omitempty"`
	Y   string `json:"y"`
	X   int64  `json:"x"`
}

type paramsStage struct{ p any }

func (s paramsStage) Params() any { return s.p }
func (s paramsStage) Run(context.Context, *Env) (*Result, error) {
	panic("not run: the test only plans")
}

// paramsKind is kind "params" whose stages have params made by mk from the
// pipeline file's x.
func paramsKind(mk func(x int64) any) Kind {
	return Kind{Version: "1", New: func(p *Params) (Stage, error) {
		x, err := p.Int("x", 0)
		if err != nil {
			return nil, err
		}
		return paramsStage{mk(x)}, nil
	}}
}

// Params are keyed in one canonical form: reordering a params struct's
// fields (nested ones too) or adding an omitempty field at its zero value
// keeps every key; another value changes it.
func TestParamsCanonicalKey(t *testing.T) {
	const src = `name: t
stages:
  - name: s
    params: { x: %X% }
`
	a := paramsKind(func(x int64) any {
		p := paramsA{X: x, Y: "why"}
		p.Inner.A, p.Inner.B = 1, 9007199254740993 // 2^53+1: kept exact
		return p
	})
	b := paramsKind(func(x int64) any {
		p := paramsB{X: x, Y: "why"}
		p.Inner.A, p.Inner.B = 1, 9007199254740993
		return p
	})
	b2 := paramsKind(func(x int64) any {
		p := paramsB{X: x, Y: "why"}
		p.Inner.A, p.Inner.B = 1, 9007199254740992
		return p
	})
	key := func(k Kind, x string) string {
		t.Helper()
		spec := loadSpecKinds(t, t.TempDir(), strings.ReplaceAll(src, "%X%", x), pipelinetest.Kinds().With("params", k))
		rep, err := Plan(spec, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Stages[0].Key == "" {
			t.Fatalf("no key: %+v", rep.Stages[0])
		}
		return rep.Stages[0].Key
	}
	ka := key(a, "1")
	if kb := key(b, "1"); kb != ka {
		t.Errorf("reordered fields and an omitempty field re-key the stage: %s vs %s", ka, kb)
	}
	if kx := key(a, "2"); kx == ka {
		t.Errorf("another x gives the same key")
	}
	if kb2 := key(b2, "1"); kb2 == ka {
		t.Errorf("2^53 and 2^53+1 give the same key: numbers lost precision")
	}
}

// An import is keyed by the files it read, not where they lie: the same
// files in two directories get one key (and neither re-runs because of the
// other), moving the directory re-reads it under the same key and re-runs
// nothing downstream, another pipeline importing the same directory skips,
// and the record holds no path outside its sources. (The imports copy:
// read in place, the blob of both would be a link to one of the two
// directories' files, and moving that one would make it missing.)
func TestImportKeyedByContent(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b"} {
		writeFile(t, filepath.Join(dir, d, "config.json"), `{"a":1}`)
		writeFile(t, filepath.Join(dir, d, "sub/w.bin"), strings.Repeat("w", 5000))
	}
	const src = `name: t
stages:
  - name: a
    import: { path: %A%, copy: true }
  - name: b
    import: { path: b, copy: true }
  - name: syn
    synth: { size: 64KiB, units: 2, seed: 1, from: a }
`
	spec := loadSpec(t, dir, strings.ReplaceAll(src, "%A%", "a"))
	ctx := context.Background()
	rep, err := Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	keyA, keySyn := rep.Stages[0].Key, rep.Stages[2].Key
	if keyA == "" || rep.Stages[1].Key != keyA {
		t.Fatalf("imports of the same files: keys %q and %q, want one", keyA, rep.Stages[1].Key)
	}
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "second run", rep, map[string]string{"a": "skip", "b": "skip", "syn": "skip"})
	store, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	rec := store.Record(keyA)
	if strings.Contains(string(rec.Params), dir) || len(rec.Sources) != 4 {
		t.Errorf("record params %s (want no path), %d sources (want both directories' 2 files)", rec.Params, len(rec.Sources))
	}

	// Another pipeline reading the same directory reads nothing again.
	other := loadSpec(t, dir, "name: t2\nstages:\n  - name: base\n    import: { path: a, copy: true }\n")
	pr, err := Plan(other, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "another pipeline", pr, map[string]string{"base": "skip: up to date (the same files as t/"})

	// Moved: read again under the same key; nothing downstream runs.
	if err := os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "moved")); err != nil {
		t.Fatal(err)
	}
	spec = loadSpec(t, dir, strings.ReplaceAll(src, "%A%", "moved"))
	pr, err = Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "plan after the move", pr, map[string]string{"a": "run: source path changed", "b": "skip", "syn": "pending"})
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after the move", rep, map[string]string{"a": "run", "b": "skip", "syn": "skip"})
	if rep.Stages[0].Key != keyA || rep.Stages[2].Key != keySyn {
		t.Errorf("keys after the move: %s %s, want %s %s", rep.Stages[0].Key, rep.Stages[2].Key, keyA, keySyn)
	}
	rep, err = Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantActions(t, "run after that", rep, map[string]string{"a": "skip", "b": "skip", "syn": "skip"})
}
