package manifest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/journal"
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
	// (A record is never rewritten: the stage points at another one, and
	// the prune drops the first.)
	if err := s.Commit(&Record{Key: "r2", Pipeline: "p", Stage: "base", Outputs: nil}); err != nil {
		t.Fatal(err)
	}
	g, err := s.GCPrune(true)
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
	if err := hashUntil(s, src, st, unit, 5*unit+100); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	d, first, err := hashFrom(s, src, st, unit)
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
	hashUntil(s, src, st, unit, 3*unit+1)
	if _, first, _ = hashFrom(s, src, other, unit); first != 0 {
		t.Errorf("a changed stamp resumed from byte %d", first)
	}
	// A file that ends early is refused.
	short := st
	short.Size += 10
	if _, err := s.HashResumable(context.Background(), "k", "w.bin", src, short, unit, nil); err == nil || !strings.Contains(err.Error(), "changed while it was being read") {
		t.Errorf("short file: %v", err)
	}
}

// HashResumable keeps its resume state in the one journal
// (internal/journal): a ref naming the output and the file's stamp, then a
// unit line per unit with its end and the sha256 state there. A resume
// trusts the last unit line only when it is one it wrote (a torn tail is
// dropped); a stale ref or a state that does not restore starts over, and
// every run ends with the file's digest. A file of one unit keeps no
// journal.
func TestHashResumableJournal(t *testing.T) {
	content := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	const unit = 64 << 10
	unitLine := func(end int64, state []byte) journal.Entry {
		return journal.Entry{Unit: hashUnit, End: end, State: state}
	}
	for _, tc := range []struct {
		name   string
		stamp  func(Stamp) Stamp                 // the stamp the resuming run gives
		tamper func(t *testing.T, p, ref string) // on the journal left by a cancelled run
		from   int64                             // where the resuming run starts
	}{
		{"as left", nil, nil, 6 * unit},
		{"torn last line", nil, func(t *testing.T, p, _ string) {
			f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(`{"unit":"hash","end":4194`)
			f.Close()
		}, 6 * unit},
		{"file changed: stale ref", func(st Stamp) Stamp { st.MtimeNs++; return st }, nil, 0},
		{"state that does not restore", nil, func(t *testing.T, p, ref string) {
			appendLines(t, p, ref, unitLine(7*unit, []byte("not a sha256 state")))
		}, 0},
		{"end past the file", nil, func(t *testing.T, p, ref string) {
			h := hashing.NewWriter(nil)
			h.Write(content[:unit])
			appendLines(t, p, ref, unitLine(int64(len(content))+unit, h.State()))
		}, 0},
		{"a line it did not write", nil, func(t *testing.T, p, ref string) {
			appendLines(t, p, ref, journal.Entry{Commit: "sha256:00", Size: 1})
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openTemp(t)
			src := filepath.Join(t.TempDir(), "w.bin")
			if err := os.WriteFile(src, content, 0o644); err != nil {
				t.Fatal(err)
			}
			st, _ := StatStamp(src)
			if err := hashUntil(s, src, st, unit, 5*unit+100); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled: %v", err)
			}
			dir, _ := s.refDir("k", "w.bin")
			jp := filepath.Join(dir, "journal")
			// The state is an internal/journal journal for this file and
			// stamp, its last unit at the end of the sixth (the one
			// cancelled inside), holding the hash of the bytes before it.
			ref := hashRef("w.bin", st)
			if got, err := journal.Ref(jp); err != nil || got != ref {
				t.Fatalf("journal ref %q %v, want %q", got, err, ref)
			}
			l, entries, _, err := journal.Open(jp, ref)
			if err != nil || len(entries) == 0 {
				t.Fatalf("journal: %v %v", entries, err)
			}
			l.Close()
			last := entries[len(entries)-1]
			h, err := hashing.Resume(nil, last.State, last.End)
			if err != nil || last.Unit != hashUnit || last.End != 6*unit || h.Sum() != sha256.Sum256(content[:last.End]) {
				t.Fatalf("last unit %q at %d (%v): not the state of the first six units", last.Unit, last.End, err)
			}
			if tc.tamper != nil {
				tc.tamper(t, jp, ref)
			}
			resumed := st
			if tc.stamp != nil {
				resumed = tc.stamp(st)
			}
			d, first, err := hashFrom(s, src, resumed, unit)
			if err != nil || d != DigestOf(content) {
				t.Fatalf("resumed: %s %v", d, err)
			}
			if first != tc.from {
				t.Errorf("resumed from byte %d, want %d", first, tc.from)
			}
			if got, _ := journal.Ref(jp); got != hashRef("w.bin", resumed) {
				t.Errorf("journal ref after the resume %q, want %q", got, hashRef("w.bin", resumed))
			}
		})
	}
	t.Run("one unit keeps no journal", func(t *testing.T) {
		s := openTemp(t)
		src := filepath.Join(t.TempDir(), "w.bin")
		os.WriteFile(src, content[:unit], 0o644)
		st, _ := StatStamp(src)
		if d, err := s.HashResumable(context.Background(), "k", "w.bin", src, st, unit, nil); err != nil || d != DigestOf(content[:unit]) {
			t.Fatalf("%s %v", d, err)
		}
		dir, _ := s.refDir("k", "w.bin")
		if _, err := os.Stat(filepath.Join(dir, "journal")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a one-unit file left a journal: %v", err)
		}
	})
}

// hashUntil hashes src (output w.bin of stage run k) resumably and cancels
// the run once at bytes are hashed.
func hashUntil(s *Store, src string, st Stamp, unit, at int64) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n int64
	_, err := s.HashResumable(ctx, "k", "w.bin", src, st, unit, func(k int64) {
		if n += k; n >= at {
			cancel()
		}
	})
	return err
}

// hashFrom hashes src (output w.bin of stage run k) resumably to the end;
// first is the byte it started from (its first progress report).
func hashFrom(s *Store, src string, st Stamp, unit int64) (d Digest, first int64, err error) {
	first = -1
	d, err = s.HashResumable(context.Background(), "k", "w.bin", src, st, unit, func(n int64) {
		if first < 0 {
			first = n
		}
	})
	return d, first, err
}

// appendLines appends entries to the journal at p, opened for ref.
func appendLines(t *testing.T, p, ref string, es ...journal.Entry) {
	t.Helper()
	l, _, _, err := journal.Open(p, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(es...); err != nil {
		t.Fatal(err)
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

// A stage that writes the bytes of an in-place blob replaces the link with
// its real file; a process killed right after that, before anything else
// saves manifest.json, must leave a store in which the records naming the
// blob still find it intact (the import that referenced it is not re-run
// for an output "changed on disk"). Each writer is tried: AdoptKnown (a
// merge's copied tokenizer), Ingest.
func TestInPlaceReplacedThenKilled(t *testing.T) {
	content := bytes.Repeat([]byte("tokenizer"), 500)
	tests := []struct {
		name  string
		write func(t *testing.T, s *Store)
	}{
		{"adopt", func(t *testing.T, s *Store) {
			p := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(p, content, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.AdoptKnown(p, DigestOf(content), int64(len(content))); err != nil {
				t.Fatal(err)
			}
		}},
		{"ingest", func(t *testing.T, s *Store) {
			if _, _, err := s.Ingest(bytes.NewReader(content), -1); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openTemp(t)
			src := filepath.Join(t.TempDir(), "tokenizer.json")
			if err := os.WriteFile(src, content, 0o644); err != nil {
				t.Fatal(err)
			}
			o := inPlace(t, s, "k", src)
			if err := s.Commit(&Record{Key: "r", Pipeline: "p", Stage: "base", Outputs: []Output{o}}); err != nil {
				t.Fatal(err)
			}
			tt.write(t, s)
			if _, ok := s.InPlace(o.Digest); ok {
				t.Fatal("the link was not replaced")
			}
			// Killed here: what the next run opens is manifest.json as
			// it is on disk.
			next, err := Open(s.Root)
			if err != nil {
				t.Fatal(err)
			}
			if why := next.CheckBlob(o.Digest, o.Size, false); why != "" {
				t.Errorf("after a kill: %s", why)
			}
			if why := s.CheckBlob(o.Digest, o.Size, false); why != "" {
				t.Errorf("in the run that replaced it: %s", why)
			}
		})
	}
}
