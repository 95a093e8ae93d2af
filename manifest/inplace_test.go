package manifest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// inPlace hashes the file at p and references it as a blob.
func inPlace(t *testing.T, s *Store, key, p string) Output {
	t.Helper()
	st, err := StatStamp(p)
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.HashResumable(context.Background(), key, filepath.Base(p), p, st, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reference(p, d, st); err != nil {
		t.Fatal(err)
	}
	return Output{Path: filepath.Base(p), Digest: d, Size: st.Size}
}

// A blob read in place is the file: CheckBlob follows its stamp, a rehash
// its content; verify re-hashes it (and only reads it); gc removes the link
// and never the file; a stage writing the same bytes replaces the link with
// a real file.
func TestInPlaceBlob(t *testing.T) {
	s := openTemp(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	content := bytes.Repeat([]byte("weights!"), 1000)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	o := inPlace(t, s, "k", src)
	if o.Digest != DigestOf(content) {
		t.Fatalf("digest %s, want %s", o.Digest, DigestOf(content))
	}
	if got, ok := s.InPlace(o.Digest); !ok || got != src {
		t.Fatalf("InPlace: %q %v, want a link to %s", got, ok, src)
	}
	if err := s.Commit(&Record{Key: "r", Pipeline: "p", Stage: "base", Outputs: []Output{o}}); err != nil {
		t.Fatal(err)
	}
	if why := s.CheckBlob(o.Digest, o.Size, false); why != "" {
		t.Fatalf("fresh in-place blob: %s", why)
	}
	if got, _, err := HashFile(s.BlobPath(o.Digest)); err != nil || got != o.Digest {
		t.Fatalf("reading the blob: %s %v", got, err)
	}

	// Touched: the stamp says changed; a rehash finds the same bytes and
	// re-stamps it.
	later := time.Now().Add(time.Hour)
	os.Chtimes(src, later, later)
	if why := s.CheckBlob(o.Digest, o.Size, false); !strings.Contains(why, "changed on disk") || !strings.Contains(why, src) {
		t.Errorf("touched: %q", why)
	}
	if why := s.CheckBlob(o.Digest, o.Size, true); why != "" {
		t.Errorf("touched, re-hashed: %q", why)
	}
	if why := s.CheckBlob(o.Digest, o.Size, false); why != "" {
		t.Errorf("touched, after the rehash: %q", why)
	}

	// Rewritten: verify reports it and leaves the file as the user made it.
	changed := bytes.ToUpper(content)
	if err := os.WriteFile(src, changed, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Verify(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || rep.InPlace != 1 || rep.InPlaceBytes != o.Size || !strings.Contains(rep.Problems[0].What, src) {
		t.Errorf("verify: %+v", rep)
	}
	if why := s.CheckBlob(o.Digest, o.Size, false); !strings.HasPrefix(why, "damaged") {
		t.Errorf("after verify: %q", why)
	}
	if b, _ := os.ReadFile(src); !bytes.Equal(b, changed) {
		t.Error("verify changed the in-place file")
	}

	// Unreferenced: gc removes the link, frees nothing, keeps the file.
	s.Commit(&Record{Key: "r", Pipeline: "p", Stage: "base", Outputs: nil})
	g, err := s.GC(true)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBlobs != 1 || g.RemovedInPlace != 1 || g.RemovedBytes != 0 {
		t.Errorf("gc: %+v", g)
	}
	if _, err := os.Lstat(s.BlobPath(o.Digest)); !errors.Is(err, os.ErrNotExist) {
		t.Error("gc kept the link")
	}
	if b, err := os.ReadFile(src); err != nil || !bytes.Equal(b, changed) {
		t.Errorf("gc touched the in-place file: %v", err)
	}

	// A stage that writes the same bytes turns the link into a file.
	o2 := inPlace(t, s, "k2", src)
	d, _, err := s.Ingest(bytes.NewReader(changed), -1)
	if err != nil || d != o2.Digest {
		t.Fatalf("ingest: %s %v", d, err)
	}
	if _, ok := s.InPlace(d); ok {
		t.Error("a real blob did not replace the in-place link")
	}
	if why := s.CheckBlob(d, o2.Size, true); why != "" {
		t.Errorf("replaced blob: %s", why)
	}
}

// HashResumable saves the hash state at unit boundaries: cancelled
// partway, it resumes from the last boundary (progress starts there) and
// ends with the digest of the whole file; a file whose stamp changed starts
// over.
func TestHashResumable(t *testing.T) {
	s := openTemp(t)
	src := filepath.Join(t.TempDir(), "w.bin")
	content := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := StatStamp(src)
	const unit = 64 << 10
	ctx, cancel := context.WithCancel(context.Background())
	var done int64
	_, err := s.HashResumable(ctx, "k", "w.bin", src, st, unit, func(n int64) {
		if done += n; done >= 5*unit+100 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	var first int64 = -1
	d, err := s.HashResumable(context.Background(), "k", "w.bin", src, st, unit, func(n int64) {
		if first < 0 {
			first = n
		}
	})
	if err != nil || d != DigestOf(content) {
		t.Fatalf("resumed: %s %v", d, err)
	}
	// Cancelled inside the sixth unit, which is finished before the
	// context is checked again.
	if first != 6*unit {
		t.Errorf("resumed from byte %d, want %d", first, 6*unit)
	}
	// The same ref with another stamp (the file changed) starts at 0.
	other := st
	other.MtimeNs++
	cancelAt := func(at int64) (context.Context, func(int64)) {
		ctx, cancel := context.WithCancel(context.Background())
		var n int64
		return ctx, func(k int64) {
			if n += k; n >= at {
				cancel()
			}
		}
	}
	ctx, prog := cancelAt(3*unit + 1)
	s.HashResumable(ctx, "k", "w.bin", src, st, unit, prog)
	first = -1
	s.HashResumable(context.Background(), "k", "w.bin", src, other, unit, func(n int64) {
		if first < 0 {
			first = n
		}
	})
	if first != 0 {
		t.Errorf("a changed stamp resumed from byte %d", first)
	}
	// A file that ends early is refused.
	short := st
	short.Size += 10
	if _, err := s.HashResumable(context.Background(), "k", "w.bin", src, short, unit, nil); err == nil || !strings.Contains(err.Error(), "changed while it was being read") {
		t.Errorf("short file: %v", err)
	}
}

// Where the store's file system clones, IngestClone makes a blob of its
// own with the file's digest; elsewhere it says so and leaves nothing.
func TestIngestClone(t *testing.T) {
	s := openTemp(t)
	src := filepath.Join(s.Root, "..", "w.bin") // same file system as the store
	content := bytes.Repeat([]byte("clone me"), 5000)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := StatStamp(src)
	d, err := s.IngestClone(context.Background(), "k", "w.bin", src, st, 1<<20, nil)
	if errors.Is(err, fsutil.ErrCloneUnsupported) {
		t.Logf("no reflinks here: %v", err)
		if ents, _ := os.ReadDir(filepath.Join(s.Root, "blobs", Algorithm)); len(ents) != 0 {
			t.Errorf("a failed clone left %d blobs", len(ents))
		}
		return
	}
	if err != nil || d != DigestOf(content) {
		t.Fatalf("clone: %s %v", d, err)
	}
	if _, ok := s.InPlace(d); ok {
		t.Error("a clone is a link")
	}
	os.WriteFile(src, []byte("changed"), 0o644)
	if why := s.CheckBlob(d, int64(len(content)), true); why != "" {
		t.Errorf("the clone changed with its source: %s", why)
	}
}

// DiskUsage says what each record holds in blobs and in place, what is
// shared, and what gc (with and without --prune-records) would free.
func TestDiskUsage(t *testing.T) {
	s := openTemp(t)
	src := filepath.Join(t.TempDir(), "base.bin")
	os.WriteFile(src, bytes.Repeat([]byte("b"), 3000), 0o644)
	base := inPlace(t, s, "k", src)
	ingest := func(b []byte) Output {
		d, n, err := s.Ingest(bytes.NewReader(b), -1)
		if err != nil {
			t.Fatal(err)
		}
		return Output{Path: "x", Digest: d, Size: n}
	}
	merged := ingest(bytes.Repeat([]byte("m"), 500))
	old := ingest(bytes.Repeat([]byte("o"), 200))
	ingest(bytes.Repeat([]byte("g"), 70)) // garbage
	for _, r := range []*Record{
		{Key: "1", Pipeline: "p", Stage: "base", Outputs: []Output{base}},
		{Key: "2", Pipeline: "p", Stage: "merged", Outputs: []Output{merged}},
		{Key: "3", Pipeline: "p", Stage: "copy", Outputs: []Output{merged}},
		{Key: "4", Pipeline: "p", Stage: "old", Outputs: []Output{old}},
	} {
		if err := s.Commit(r); err != nil {
			t.Fatal(err)
		}
	}
	s.Link("p", "old", "2") // record 4 is no longer what a stage points at
	du, err := s.DiskUsage()
	if err != nil {
		t.Fatal(err)
	}
	if du.BlobBytes != 770 || du.InPlaceBytes != 3000 {
		t.Errorf("totals: %d in blobs, %d in place", du.BlobBytes, du.InPlaceBytes)
	}
	by := map[string]StageUsage{}
	for _, u := range du.Stages {
		by[u.Key] = u
	}
	if u := by["1"]; u.InPlaceBytes != 3000 || u.BlobBytes != 0 || !u.Live {
		t.Errorf("base: %+v", u)
	}
	if u := by["2"]; u.BlobBytes != 500 || u.SharedBytes != 500 {
		t.Errorf("merged: %+v", u)
	}
	if u := by["4"]; u.Live || u.BlobBytes != 200 {
		t.Errorf("old: %+v", u)
	}
	if du.GC != (FreeUsage{Blobs: 1, Bytes: 70}) || du.GCPrune != (FreeUsage{Records: 1, Blobs: 2, Bytes: 270}) {
		t.Errorf("gc %+v, gc --prune-records %+v", du.GC, du.GCPrune)
	}
	// What du says gc frees is what gc frees.
	g, err := s.GCPrune(false)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBytes != du.GCPrune.Bytes || g.RemovedBlobs != du.GCPrune.Blobs || g.PrunedRecords != du.GCPrune.Records {
		t.Errorf("gc --prune-records removed %+v, du said %+v", g, du.GCPrune)
	}
	if _, err := os.Stat(src); err != nil {
		t.Errorf("in-place file: %v", err)
	}
}
