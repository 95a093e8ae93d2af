package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/pipeline"
)

// A pipeline run on a machine's own store seeds a bucket with `ferry store
// copy`; another machine pulls the bucket into its own store and runs the
// same pipeline: every stage but the imports (its own files) is found made,
// and what its views show is byte for byte what the first machine made.
func TestStoreCopyPipelineStores(t *testing.T) {
	srv := s3test.Start(t, "ferry-copy")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	root := t.TempDir()
	gpu := newSharedMachine(t, root, "gpu", ".ferry")
	mac := newSharedMachine(t, root, "mac", ".ferry")
	runPipeline := func(m sharedMachine) map[string]pipeline.StageReport {
		t.Helper()
		out, code, err := runFerry(t, "pipeline", "run", "--json", m.file)
		if code != 0 {
			t.Fatalf("%s: pipeline run: exit %d: %v\n%s", m.name, code, err, out)
		}
		var rep pipeline.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%s: report: %v\n%s", m.name, err, out)
		}
		got := map[string]pipeline.StageReport{}
		for _, s := range rep.Stages {
			got[s.Stage] = s
		}
		return got
	}
	copyStore := func(src, dst string) map[string]any {
		t.Helper()
		out, code, err := runFerry(t, "store", "copy", "--json", "--cache", filepath.Join(root, "copy-cache"), src, dst)
		if code != 0 {
			t.Fatalf("store copy %s %s: exit %d: %v\n%s", src, dst, code, err, out)
		}
		var rep map[string]any
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("copy report: %v\n%s", err, out)
		}
		return rep
	}
	made := runPipeline(gpu)
	const bucket = "s3://ferry-copy/team"
	gpuStore := filepath.Join(gpu.dir, ".ferry")
	// Four stages read only the store: their records go; the imports'
	// records name the gpu's files and stay there.
	if rep := copyStore(gpuStore, bucket); rep["records"] != 4.0 || rep["refs"] != 4.0 {
		t.Errorf("seeding the bucket: %v", rep)
	}
	// Named by its pipeline file, as verify, du and gc take it.
	if rep := copyStore(gpu.file, bucket); rep["records"] != 0.0 || rep["records_there"] != 4.0 || rep["blobs"] != 0.0 {
		t.Errorf("copied again: %v", rep)
	}
	if out, code, err := runFerry(t, "store", "verify", bucket); code != 0 {
		t.Fatalf("verify %s: exit %d: %v\n%s", bucket, code, err, out)
	}

	macStore := filepath.Join(mac.dir, ".ferry")
	copyStore(bucket, macStore)
	got := runPipeline(mac)
	for name, s := range got {
		want := pipeline.ActionSkip
		if name == "base" || name == "adapter" {
			want = pipeline.ActionRun // this machine's files
		}
		if s.Action != want || s.Key != made[name].Key {
			t.Errorf("mac %s: %s (%s), key %s; want %s, key %s", name, s.Action, s.Reason, s.Key, want, made[name].Key)
		}
	}
	for _, out := range []string{"merged", "gguf", "quants"} {
		a, b := contentDigests(t, filepath.Join(gpu.dir, "out", out)), contentDigests(t, filepath.Join(mac.dir, "out", out))
		if len(a) == 0 || !maps.Equal(a, b) {
			t.Errorf("out/%s differs between the machines:\n%v\n%v", out, a, b)
		}
	}
	// The pulled blobs were stamped by the copy: nothing is damaged, a
	// second run skips everything.
	for name, s := range runPipeline(mac) {
		if s.Action != pipeline.ActionSkip {
			t.Errorf("mac, again: %s %s (%s)", name, s.Action, s.Reason)
		}
	}
	if out, code, err := runFerry(t, "store", "verify", macStore); code != 0 || !strings.Contains(out, "0 unreferenced blobs") {
		t.Errorf("verify %s: exit %d: %v\n%s", macStore, code, err, out)
	}
}

// contentDigests maps every file under root (through links) to the
// SHA-256 of its bytes.
func contentDigests(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		rel, _ := filepath.Rel(root, p)
		m[rel] = hex.EncodeToString(sum[:])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
