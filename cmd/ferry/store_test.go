package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/manifest"
)

// store du says, per stage, what is held in blobs and what is read in place
// (an import), which records are old, and what gc would free — and gc then
// frees that, never an imported file.
func TestStoreDU(t *testing.T) {
	dir := t.TempDir()
	weights := bytes.Repeat([]byte("w"), 300_000)
	os.MkdirAll(filepath.Join(dir, "m"), 0o755)
	os.WriteFile(filepath.Join(dir, "m", "w.bin"), weights, 0o644)
	os.WriteFile(filepath.Join(dir, "m", "config.json"), []byte(`{"a":1}`), 0o644)
	// Other bytes for the copying import: with the same bytes its blobs
	// would replace the in-place links (the store holds them anyway).
	os.MkdirAll(filepath.Join(dir, "c"), 0o755)
	os.WriteFile(filepath.Join(dir, "c", "w.bin"), bytes.Repeat([]byte("c"), 300_000), 0o644)
	os.WriteFile(filepath.Join(dir, "c", "config.json"), []byte(`{"c":1}`), 0o644)
	clones := fsutil.Clone(filepath.Join(dir, "m", "config.json"), filepath.Join(dir, "probe")) == nil
	p := filepath.Join(dir, "p.yaml")
	// Stage s, a copying import of 5000 bytes, changes its parameters.
	for _, v := range []string{"1", "2"} {
		os.MkdirAll(filepath.Join(dir, "s"+v), 0o755)
		os.WriteFile(filepath.Join(dir, "s"+v, "x.bin"), bytes.Repeat([]byte(v), 5000), 0o644)
	}
	spec := func(seed string) {
		os.WriteFile(p, []byte("name: d\nstages:\n"+
			"  - name: in\n    import: { path: m }\n"+
			"  - name: copied\n    import: { path: c, copy: true }\n"+
			"  - name: s\n    import: { path: s"+seed+", copy: true }\n"), 0o644)
	}
	run := func(args ...string) string {
		t.Helper()
		out, code, err := runFerry(t, args...)
		if code != 0 {
			t.Fatalf("ferry %v: exit %d: %v\n%s", args, code, err, out)
		}
		return out
	}
	spec("1")
	run("pipeline", "run", p)
	spec("2") // the first record of s is now an old one
	run("pipeline", "run", p)

	var du manifest.DiskUsage
	if err := json.Unmarshal([]byte(run("store", "du", "--json", p)), &du); err != nil {
		t.Fatal(err)
	}
	const total = 300_000 + 7
	by := map[string][]manifest.StageUsage{}
	for _, u := range du.Stages {
		by[u.Stage] = append(by[u.Stage], u)
	}
	in, copied := by["in"][0], by["copied"][0]
	if clones {
		if in.InPlaceBytes != 0 || in.BlobBytes != total {
			t.Errorf("import on a file system with reflinks: %+v", in)
		}
	} else if in.InPlaceBytes != total || in.BlobBytes != 0 {
		t.Errorf("in-place import: %+v, want %d bytes in place", in, total)
	}
	// The copying import holds its bytes.
	if copied.BlobBytes != total || copied.InPlaceBytes != 0 || copied.SharedBytes != 0 {
		t.Errorf("copying import: %+v", copied)
	}
	if s := by["s"]; len(s) != 2 || !s[0].Live || s[1].Live || s[1].BlobBytes != 5000 {
		t.Errorf("records of s: %+v", s)
	}
	if du.GC.Bytes != 0 || du.GCPrune != (manifest.FreeUsage{Records: 1, Blobs: 1, Bytes: 5000}) {
		t.Errorf("gc %+v, gc --prune-records %+v", du.GC, du.GCPrune)
	}
	text := run("store", "du", p)
	for _, want := range []string{"d/in", "d/s (old)", "read in place", "gc --prune-records 5.00 kB (1 records, 1 blobs)"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}

	// --dry-run removes nothing and says what gc would; --grace is for
	// a shared store.
	var dry gcDryRun
	if err := json.Unmarshal([]byte(run("store", "gc", "--prune-records", "--dry-run", "--json", p)), &dry); err != nil {
		t.Fatal(err)
	}
	if !dry.DryRun || dry.Records != 1 || dry.Blobs != 1 || dry.Bytes != 5000 {
		t.Errorf("gc --dry-run: %+v", dry)
	}
	if text := run("store", "gc", "--prune-records", "--dry-run", p); !strings.Contains(text, "would prune 1 records and remove 1 blobs (5.00 kB") {
		t.Errorf("gc --dry-run: %s", text)
	}
	var again manifest.DiskUsage
	if err := json.Unmarshal([]byte(run("store", "du", "--json", p)), &again); err != nil || again.GCPrune != du.GCPrune {
		t.Errorf("after gc --dry-run: %+v, %v", again.GCPrune, err)
	}
	if _, code, err := runFerry(t, "store", "gc", "--grace", "1h", p); code != 2 || err == nil || !strings.Contains(err.Error(), "no grace period applies") {
		t.Errorf("gc --grace on a pipeline's store: exit %d, %v", code, err)
	}
	if _, code, err := runFerry(t, "store", "verify", "--repair", p); code != 2 || err == nil || !strings.Contains(err.Error(), "its next run makes those stages again") {
		t.Errorf("verify --repair on a pipeline's store: exit %d, %v", code, err)
	}

	var g manifest.GCReport
	if err := json.Unmarshal([]byte(run("store", "gc", "--prune-records", "--json", p)), &g); err != nil {
		t.Fatal(err)
	}
	if g.RemovedBytes != du.GCPrune.Bytes || g.RemovedBlobs != du.GCPrune.Blobs {
		t.Errorf("gc removed %+v, du said %+v", g, du.GCPrune)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "m", "w.bin")); err != nil || !bytes.Equal(b, weights) {
		t.Errorf("the imported file after gc: %v", err)
	}
	if v := run("store", "verify", p); !clones && !strings.Contains(v, "(2, 300007 bytes, read in place from imported files)") {
		t.Errorf("store verify: %s", v)
	}
}

func TestSizeText(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.00 kB", 29_800: "29.8 kB", 7_380_856: "7.38 MB", 728_000_000: "728 MB", 2_100_000_000: "2.10 GB"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}
