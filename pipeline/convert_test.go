package pipeline_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/manifest"

	. "github.com/ferry-llm/ferry/pipeline"
)

// A store written by an earlier release (manifest.json format 1: keys with
// ferry's version, imports keyed by their path; testdata/store-v1, made by
// main before the key change) converts once, re-running nothing: plan and
// status read it as up to date, a run skips every stage and saves it in
// the current format, under the keys this release gives the same stages.
func TestConvertV1Store(t *testing.T) {
	dir := t.TempDir()
	spec := demoSpec(t, dir)
	ctx := context.Background()
	// The demo's blobs and the keys this release gives its stages.
	fresh, err := Run(ctx, spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, s := range fresh.Stages {
		want[s.Stage] = s.Key
	}
	mpath := filepath.Join(spec.Store, "manifest.json")
	var cur struct {
		Blobs map[string]json.RawMessage `json:"blobs"`
	}
	readJSON(t, mpath, &cur)

	// The old manifest, as the machine that wrote it would have it here:
	// its sources' paths and every stamp (size, mtime, inode: facts of one
	// machine) made this checkout's. Its blobs must be the ones made now.
	var old map[string]any
	readJSON(t, "testdata/store-v1/manifest.json", &old)
	if v := old["version"]; v != 1.0 {
		t.Fatalf("fixture version %v", v)
	}
	td, err := filepath.Abs("../testdata")
	if err != nil {
		t.Fatal(err)
	}
	oldKeys := map[string]string{}
	for _, r := range old["records"].(map[string]any) {
		rec := r.(map[string]any)
		oldKeys[rec["stage"].(string)] = rec["key"].(string)
		srcs, _ := rec["sources"].(map[string]any)
		if srcs == nil {
			continue
		}
		params := rec["params"].(map[string]any)
		oldTD := params["path"].(string)
		oldTD = oldTD[:strings.Index(oldTD, "/models/")]
		params["path"] = td + strings.TrimPrefix(params["path"].(string), oldTD)
		moved := map[string]any{}
		for p := range srcs {
			np := td + strings.TrimPrefix(p, oldTD)
			st, err := manifest.StatStamp(np)
			if err != nil {
				t.Fatal(err)
			}
			moved[np] = st
		}
		rec["sources"] = moved
	}
	oldBlobs := slices.Sorted(maps.Keys(old["blobs"].(map[string]any)))
	if got := slices.Sorted(maps.Keys(cur.Blobs)); !slices.Equal(got, oldBlobs) {
		t.Fatalf("the demo's blobs differ from the ones the old release made:\n%v\n%v", got, oldBlobs)
	}
	old["blobs"] = cur.Blobs
	b, err := json.MarshalIndent(old, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mpath, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// Plan and status read it (converted in memory, nothing written).
	pr, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range pr.Stages {
		if s.Action != ActionSkip || s.Key != want[s.Stage] {
			t.Errorf("plan %s: %s %s, key %s, want skip %s", s.Stage, s.Action, s.Reason, s.Key, want[s.Stage])
		}
	}
	st, err := Status(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Stages {
		if s.State != StateComplete || s.Key != want[s.Stage] {
			t.Errorf("status %s: %s %s, key %s", s.Stage, s.State, s.Detail, s.Key)
		}
	}
	var v struct{ Version int }
	if readJSON(t, mpath, &v); v.Version != 1 {
		t.Fatalf("plan or status wrote manifest.json (version %d)", v.Version)
	}

	rep, err := Run(ctx, spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Stages {
		if s.Action != ActionSkip || s.Key != want[s.Stage] {
			t.Errorf("run %s: %s %s, key %s, want skip %s", s.Stage, s.Action, s.Reason, s.Key, want[s.Stage])
		}
	}
	store, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	var saved struct {
		Version   int
		Pipelines map[string]map[string]string
	}
	readJSON(t, mpath, &saved)
	if saved.Version != manifest.FormatVersion || !maps.Equal(saved.Pipelines["demo"], want) {
		t.Errorf("saved: version %d, pipeline %v; want %d, %v", saved.Version, saved.Pipelines["demo"], manifest.FormatVersion, want)
	}
	for _, rec := range store.Records() {
		if rec.Key != want[rec.Stage] || rec.FerryVersion != "0.1.0" {
			t.Errorf("record %s: key %s, made by %q", rec.Stage, rec.Key, rec.FerryVersion)
		}
		if rec.Key == oldKeys[rec.Stage] {
			t.Errorf("record %s kept its old key", rec.Stage)
		}
		for _, in := range rec.Inputs {
			if in.Key != want[in.Stage] {
				t.Errorf("record %s: input %s key %s, want %s", rec.Stage, in.Stage, in.Key, want[in.Stage])
			}
		}
	}
}

func readJSON(t *testing.T, p string, v any) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
}
