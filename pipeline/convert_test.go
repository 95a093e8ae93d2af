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
	// The demo's blobs and the keys this release gives its stages.
	spec, want := demoMade(t)
	ctx := context.Background()
	mpath := filepath.Join(spec.Store, "manifest.json")
	var cur struct {
		Blobs map[string]json.RawMessage `json:"blobs"`
	}
	readJSON(t, mpath, &cur)
	// An old release's store has no record objects.
	dropObjects(t, spec.Store)

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
	var saved struct{ Version int }
	readJSON(t, mpath, &saved)
	if saved.Version != manifest.FormatVersion {
		t.Errorf("saved: version %d, want %d", saved.Version, manifest.FormatVersion)
	}
	if got := store.PipelineStages("demo"); !maps.Equal(got, want) {
		t.Errorf("saved: pipeline %v, want %v", got, want)
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

// dropObjects removes the record objects, refs and format object of the
// store at dir: what a store of an earlier release lacks.
func dropObjects(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"records", "refs", "format"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
}

// A store of format 2 (every record in manifest.json) converts once,
// re-running nothing: plan and status read it as up to date and write
// nothing; a run skips every stage and moves the records of every stage
// but the imports into record objects, the stages' pointers into refs,
// keeping the records as they were (keys, times, the release that made
// them).
func TestConvertV2Store(t *testing.T) {
	spec, want := demoMade(t)
	ctx := context.Background()
	made, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	before := made.Records()
	mpath := filepath.Join(spec.Store, "manifest.json")
	var m map[string]any
	readJSON(t, mpath, &m)
	var stamps struct {
		Blobs map[string]json.RawMessage `json:"blobs"`
	}
	readJSON(t, mpath, &stamps) // exact: nanoseconds do not fit a float
	recs := map[string]any{}
	for _, r := range before {
		r.FerryVersion = "0.2.0" // the release that made it
		recs[r.Key] = r
	}
	m["version"], m["records"], m["pipelines"], m["blobs"] = 2, recs, map[string]any{"demo": want}, stamps.Blobs
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mpath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	dropObjects(t, spec.Store)

	pr, err := Plan(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range pr.Stages {
		if s.Action != ActionSkip || s.Key != want[s.Stage] {
			t.Errorf("plan %s: %s %s, key %s, want skip %s", s.Stage, s.Action, s.Reason, s.Key, want[s.Stage])
		}
	}
	if _, err := os.Stat(filepath.Join(spec.Store, "records")); err == nil {
		t.Error("plan wrote record objects")
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

	var saved struct {
		Version   int
		Records   map[string]manifest.Record
		Pipelines map[string]map[string]string
	}
	readJSON(t, mpath, &saved)
	if saved.Version != manifest.FormatVersion {
		t.Errorf("saved version %d, want %d", saved.Version, manifest.FormatVersion)
	}
	store, err := manifest.Load(spec.Store)
	if err != nil {
		t.Fatal(err)
	}
	if got := store.PipelineStages("demo"); !maps.Equal(got, want) {
		t.Errorf("pipeline %v, want %v", got, want)
	}
	for _, r := range before {
		got := store.Record(r.Key)
		_, inManifest := saved.Records[r.Key]
		ref, refErr := os.ReadFile(filepath.Join(spec.Store, "refs", "pipelines", "demo", r.Stage))
		_, objErr := os.Stat(filepath.Join(spec.Store, "records", r.Key+".json"))
		switch {
		case got == nil || got.FerryVersion != "0.2.0" || !got.Finished.Equal(r.Finished) || got.OutputsDigest() != r.OutputsDigest():
			t.Errorf("record %s (%s) after the conversion: %+v", r.Key, r.Stage, got)
		case r.Kind == "import" && (!inManifest || saved.Pipelines["demo"][r.Stage] != r.Key || objErr == nil || refErr == nil):
			t.Errorf("import %s: in manifest.json %v, pointer %q, object %v, ref %v", r.Stage, inManifest, saved.Pipelines["demo"][r.Stage], objErr, refErr)
		case r.Kind != "import" && (inManifest || saved.Pipelines["demo"][r.Stage] != "" || objErr != nil || strings.TrimSpace(string(ref)) != r.Key):
			t.Errorf("stage %s: in manifest.json %v, pointer %q, object %v, ref %q", r.Stage, inManifest, saved.Pipelines["demo"][r.Stage], objErr, ref)
		}
	}
}

// demoMade runs the demo on a new store and returns it with the key of
// each stage.
func demoMade(t *testing.T) (*Spec, map[string]string) {
	t.Helper()
	spec := demoSpec(t, t.TempDir())
	fresh, err := Run(context.Background(), spec, Options{Stages: 2, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, s := range fresh.Stages {
		want[s.Stage] = s.Key
	}
	return spec, want
}
