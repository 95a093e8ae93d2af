package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/internal/s3test"
	"github.com/ferry-llm/ferry/store"
	"github.com/ferry-llm/ferry/store/local"
)

// A shared store seeded on one machine, copied to a bucket, verified, measured,
// collected and pulled back, through the CLI against a real versitygw.
func TestStoreSharedCommands(t *testing.T) {
	srv := s3test.Start(t, "ferry-cli")
	srv.Env(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	ctx := context.Background()
	seed := filepath.Join(t.TempDir(), "seed")
	b, err := local.New(seed)
	if err != nil {
		t.Fatal(err)
	}
	s, err := store.Open(ctx, b, store.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("weights "), 3<<20) // 24 MiB: multipart
	cfg := []byte(`{"model_type":"qwen3"}`)
	var outs []store.Output
	for i, body := range [][]byte{data, cfg} {
		d := digest.Of(body)
		if err := s.PutBlob(ctx, d, bytes.NewReader(body), int64(len(body)), nil); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, store.Output{Path: []string{"w.safetensors", "config.json"}[i], Digest: d, Size: int64(len(body))})
	}
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "k1", Outputs: outs}); err != nil {
		t.Fatal(err)
	}
	run := func(want int, args ...string) string {
		t.Helper()
		out, code, err := runFerry(t, args...)
		if code != want {
			t.Fatalf("ferry %v: exit %d, want %d: %v\n%s", args, code, want, err, out)
		}
		return out
	}
	const bucket = "s3://ferry-cli/team"
	before := treeOf(t, seed)
	out := run(0, "store", "copy", "--cache", filepath.Join(t.TempDir(), "cache"), seed, bucket)
	if after := treeOf(t, seed); after != before {
		t.Errorf("the copy's source changed:\n%s\nafter:\n%s", before, after)
	}
	if !strings.Contains(out, "1 records copied (0 already there), 2 blobs copied (25.2 MB; 0 already there)") {
		t.Errorf("copy: %s", out)
	}
	out = run(0, "store", "verify", bucket)
	if !strings.Contains(out, "store s3://ferry-cli/team: 2 blobs (25165846 bytes) re-hashed, 1 records checked, 0 unreferenced blobs") {
		t.Errorf("verify: %s", out)
	}
	var u store.Usage
	if err := json.Unmarshal([]byte(run(0, "store", "du", "--json", bucket)), &u); err != nil || u.Blobs != 2 || u.Records != 1 || u.BlobBytes != 25165846 ||
		len(u.ByRecord) != 1 || u.ByRecord[0].Key != "k1" || u.ByRecord[0].Bytes != 25165846 || u.ByRecord[0].SharedBytes != 0 || u.ByRecord[0].Missing != 0 {
		t.Errorf("du: %+v, %v", u, err)
	}
	if out := run(0, "store", "du", bucket); !strings.Contains(out, "(no ref)") || !strings.Contains(out, "25.2 MB") {
		t.Errorf("du: %s", out)
	}
	out = run(0, "store", "gc", "--dry-run", "--grace", "1ns", bucket)
	if !strings.Contains(out, "would remove 0 blobs") || !strings.Contains(out, "kept 2 blobs named by records") {
		t.Errorf("gc: %s", out)
	}
	// A dry run writes nothing, not even its lease.
	if _, err := os.Stat(srv.ObjectPath("ferry-cli", "team/leases/gc")); err == nil {
		t.Error("gc --dry-run wrote the gc lease")
	}
	run(0, "store", "gc", bucket)
	if _, err := os.Stat(srv.ObjectPath("ferry-cli", "team/leases/gc")); err != nil {
		t.Errorf("gc took no lease: %v", err)
	}
	run(2, "store", "gc", "--journals", bucket)
	// k1 has no ref: the result of an earlier parameter, say, written
	// a day ago.
	day := time.Now().Add(-24 * time.Hour)
	if err := os.Chtimes(srv.ObjectPath("ferry-cli", "team/records/k1.json"), day, day); err != nil {
		t.Fatal(err)
	}
	if out := run(0, "store", "gc", "--prune-records", "--dry-run", bucket); !strings.Contains(out, "would prune 1 records no ref names") || !strings.Contains(out, "kept 0 blobs named by records, 0 protected by live leases, 2 younger than") {
		t.Errorf("gc --prune-records --dry-run: %s", out)
	}
	run(2, "store", "gc", "--grace", "0s", bucket)

	back := filepath.Join(t.TempDir(), "mac")
	run(0, "store", "copy", bucket, back)
	run(0, "store", "verify", back)
	got, err := os.ReadFile(filepath.Join(back, "blobs", "sha256", outs[0].Digest.Hex()))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("pulled blob: %v", err)
	}

	// A copy killed while it opened a new destination (or a second one
	// started beside it) left only the backend's scaffolding, before
	// the store's format object: the next copy goes on there.
	cut := filepath.Join(t.TempDir(), "cut")
	for _, d := range []string{".locks", ".tmp", ".uploads", "probe/0123"} {
		if err := os.MkdirAll(filepath.Join(cut, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(0, "store", "copy", bucket, cut)
	run(0, "store", "verify", cut)
	// What a copy killed mid-fetch leaves in a directory store is counted
	// by du and removed by gc past its grace period.
	old := time.Now().Add(-3 * time.Hour)
	for name, size := range map[string]int{"copy-0a.partial": 4096, "copy-0a.partial.journal": 64} {
		p := filepath.Join(cut, ".tmp", name)
		if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, old, old)
	}
	if out := run(0, "store", "du", cut); !strings.Contains(out, "2 temp files (4.16 kB;") {
		t.Errorf("du of a store with a killed copy's files: %s", out)
	}
	if out := run(0, "store", "gc", cut); !strings.Contains(out, "2 temp files (4.16 kB)") {
		t.Errorf("gc of a store with a killed copy's files: %s", out)
	}
	if ents, err := os.ReadDir(filepath.Join(cut, ".tmp")); err != nil || len(ents) != 0 {
		t.Errorf("after gc, .tmp holds %d entries (%v)", len(ents), err)
	}

	// A destination that is neither a store nor empty (a model's
	// directory) is refused before anything is written into it.
	model := filepath.Join(t.TempDir(), "model")
	os.MkdirAll(model, 0o755)
	os.WriteFile(filepath.Join(model, "model.safetensors"), data[:100], 0o644)
	if out, code, err := runFerry(t, "store", "copy", bucket, model); code != 2 || err == nil || !strings.Contains(err.Error(), "neither a ferry store nor empty") {
		t.Errorf("copy into a model's directory: exit %d, %v\n%s", code, err, out)
	}
	if ents, _ := os.ReadDir(model); len(ents) != 1 {
		t.Errorf("the model's directory holds %d entries after a refused copy", len(ents))
	}
	if _, code, err := runFerry(t, "store", "copy", seed, filepath.Join(seed, "sub")); code != 2 || err == nil || !strings.Contains(err.Error(), "one is inside the other") {
		t.Errorf("copy into its own source: exit %d, %v", code, err)
	}
	// file:// names a directory as a pipeline file's store: does.
	run(0, "store", "verify", "file://"+back)

	// A blob gone from the bucket (a lifecycle rule, a hand): copying
	// again puts it back, though its record is there.
	if err := os.Remove(srv.ObjectPath("ferry-cli", "team/blobs/sha256/"+outs[1].Digest.Hex())); err != nil {
		t.Fatal(err)
	}
	run(3, "store", "verify", bucket)
	out = run(0, "store", "copy", seed, bucket)
	if !strings.Contains(out, "0 records copied (1 already there), 1 blobs copied (22 B; 1 already there)") {
		t.Errorf("copy that repairs: %s", out)
	}
	run(0, "store", "verify", bucket)

	// A blob damaged on the server's disk: verify exits 3 and names it.
	if err := os.WriteFile(srv.ObjectPath("ferry-cli", "team/blobs/sha256/"+outs[1].Digest.Hex()), []byte(`{"model_type":"qwen2"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code, err := runFerry(t, "store", "verify", bucket)
	if code != 3 || !strings.Contains(out, "DAMAGED blob "+string(outs[1].Digest)) || !strings.Contains(out, "named by record k1\n") ||
		err == nil || !strings.Contains(err.Error(), "'ferry store verify --repair "+bucket+"' removes the 1 damaged blob") {
		t.Errorf("verify of a damaged blob: exit %d, %v\n%s", code, err, out)
	}
	// A copy from it copies what it can and names what it could not.
	if err := s.PutBlob(ctx, digest.Of([]byte("other")), bytes.NewReader([]byte("other")), 5, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitRecord(ctx, &store.Record{Key: "k2", Outputs: []store.Output{{Path: "o", Digest: digest.Of([]byte("other")), Size: 5}}}); err != nil {
		t.Fatal(err)
	}
	run(0, "store", "copy", seed, bucket)
	pulled := filepath.Join(t.TempDir(), "pulled")
	out = run(3, "store", "copy", bucket, pulled)
	if !strings.Contains(out, "1 records copied (0 already there)") || !strings.Contains(out, "NOT COPIED record k1, output config.json") {
		t.Errorf("copy of a bucket with a damaged blob: %s", out)
	}
	if _, err := os.Stat(filepath.Join(pulled, "records", "k1.json")); err == nil {
		t.Error("the record whose blob is damaged was copied")
	}
	// --repair removes the damaged blob (and nothing whole); a copy from
	// a store that holds it whole, or the next run of its stage, puts it
	// back.
	damagedKey := "team/blobs/sha256/" + outs[1].Digest.Hex()
	out = run(3, "store", "verify", "--repair", bucket)
	if !strings.Contains(out, "removed: the next run that needs it makes it again") {
		t.Errorf("verify --repair: %s", out)
	}
	if _, err := os.Stat(srv.ObjectPath("ferry-cli", damagedKey)); err == nil {
		t.Error("verify --repair left the damaged blob")
	}
	if _, err := os.Stat(srv.ObjectPath("ferry-cli", "team/blobs/sha256/"+outs[0].Digest.Hex())); err != nil {
		t.Errorf("verify --repair removed a whole blob: %v", err)
	}
	run(0, "store", "copy", seed, bucket)
	run(0, "store", "verify", bucket)
	if out, _, err := runFerry(t, "store", "verify", "s3://ferry-cli/nothing-here"); err == nil || !strings.Contains(err.Error(), "no ferry store there") {
		t.Errorf("verify of an empty prefix: %v\n%s", err, out)
	}
}

// treeOf lists every path under dir, with its size and mode.
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%s %d %v\n", rel, fi.Size(), fi.Mode())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestLeaseLine(t *testing.T) {
	until := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for name, want := range map[string]string{
		"stage/0a1b":       "  being made on mac: stage/0a1b (lease until 2026-11-27T12:00:00Z)",
		"pin/mac-0123abcd": "  a store copy on mac keeps the blobs it is storing: pin/mac-0123abcd (lease until 2026-11-27T12:00:00Z)",
		"run/0a1b2c":       "  a pipeline run on mac marks the stages it may make: run/0a1b2c (lease until 2026-11-27T12:00:00Z)",
		"gc":               "  held by mac: gc (lease until 2026-11-27T12:00:00Z)",
	} {
		if got := leaseLine(store.LeaseUse{Name: name, Holder: "mac", Until: until}); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}
