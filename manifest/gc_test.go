package manifest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/store"
)

// GC keeps what an unfinished stage resumes from (its journal and its work
// dir) unless asked to drop it; ingest temp files always go.
func TestGCKeepsResumeState(t *testing.T) {
	for _, journals := range []bool{false, true} {
		s := openTemp(t)
		j, err := s.OpenJournal("k", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		j.Write([]byte("unit zero"))
		if err := j.EndUnit("u0"); err != nil {
			t.Fatal(err)
		}
		j.Close()
		work := filepath.Join(s.WorkDir("k"), "half-done.safetensors")
		if err := os.MkdirAll(filepath.Dir(work), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(work, []byte("x"), 0o644)
		tmp := filepath.Join(s.Root, "tmp", "ingest-1.partial")
		os.WriteFile(tmp, []byte("x"), 0o644)

		if _, err := s.GC(journals); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("journals=%v: temp file kept", journals)
		}
		_, werr := os.Stat(work)
		j, err = s.OpenJournal("k", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		units := len(j.Units())
		j.Close()
		if journals {
			if werr == nil || units != 0 {
				t.Errorf("gc --journals kept the resume state (work dir err %v, %d journal units)", werr, units)
			}
		} else if werr != nil || units != 1 {
			t.Errorf("gc dropped the resume state (work dir err %v, %d journal units)", werr, units)
		}
	}
}

// A pipeline directory's gc is the store's (store.GC on the directory,
// under its lock): an unreferenced blob goes at once (no grace period, the
// lock keeps writers out), a blob only an import names stays (imports are
// this machine's records, in manifest.json), and an upload into the store
// left unfinished past the grace period is aborted while a young one stays
// for its copy to resume. Verify then counts both kinds of record.
func TestGCOnStore(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	ingest := func(c string) Output { return ingestString(t, s, c) }
	imported, made, orphan := ingest("imported"), ingest("made"), ingest("orphan")
	src := filepath.Join(t.TempDir(), "imported")
	if err := os.WriteFile(src, []byte("imported"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := StatStamp(src)
	if err != nil {
		t.Fatal(err)
	}
	imp := &Record{Key: "imp", Pipeline: "p", Stage: "base", Kind: "import", Params: []byte(`{}`), Sources: map[string]Stamp{src: st}, Outputs: []Output{imported}}
	obj := &Record{Key: "obj", Pipeline: "p", Stage: "merged", Kind: "merge", Params: []byte(`{}`), Outputs: []Output{made}}
	for _, r := range []*Record{imp, obj} {
		if err := s.Commit(r); err != nil {
			t.Fatal(err)
		}
	}
	if IsObject(imp) || !IsObject(obj) {
		t.Fatal("the records are not one of each kind")
	}
	b := s.Objects().Backend()
	var ids []string
	for _, c := range []string{"old copy", "young copy"} {
		id, err := b.CreateUpload(ctx, store.BlobKey(digest.Of([]byte(c))))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	old := time.Now().Add(-2 * store.DefaultGCGrace)
	if err := os.Chtimes(filepath.Join(s.Root, ".uploads", ids[0]), old, old); err != nil {
		t.Fatal(err)
	}

	s.setDamaged(orphan.Digest, "marked by an earlier verify")
	if _, ok := s.stamp(orphan.Digest); !ok {
		t.Fatal("the orphan has no stamp to drop")
	}

	g, err := s.GC(false)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBlobs != 1 || g.RemovedBytes != orphan.Size || g.KeptBlobs != 2 || g.AbortedUploads != 1 {
		t.Fatalf("gc: %+v", g)
	}
	// The machine's facts about a removed blob go with it.
	if _, ok := s.stamp(orphan.Digest); ok || s.Damage(orphan.Digest) != "" {
		t.Errorf("the removed blob kept its stamp or its damage mark (%q)", s.Damage(orphan.Digest))
	}
	if _, ok := s.stamp(imported.Digest); !ok {
		t.Error("a kept blob lost its stamp")
	}
	for _, o := range []Output{imported, made, orphan} {
		_, err := os.Stat(s.BlobPath(o.Digest))
		if (err == nil) != (o != orphan) {
			t.Errorf("blob %s: %v", o.Path, err)
		}
	}
	var left []string
	if err := b.ListUploads(ctx, "", func(u store.Upload) error { left = append(left, u.ID); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != ids[1] {
		t.Errorf("uploads left %v, want the young one %s", left, ids[1])
	}
	rep, err := s.Verify(ctx, nil)
	if err != nil || !rep.OK() || rep.Records != 2 || rep.Blobs != 2 || rep.Unreferenced != 0 {
		t.Fatalf("verify after gc: %+v, %v", rep, err)
	}
}

// What verify says of damage on a pipeline's directory, each thing once:
// a blob cut short that two records name (its bytes do not hash to its
// name: one problem for the blob and "blob damaged" for each record, not
// a size problem too), an import naming a whole blob with another size,
// and entries under blobs/ no digest names (a file, a link, a directory
// with a file in it), which gc removes but for the directory.
func TestVerifyProblemsOnce(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	ingest := func(c string) Output { return ingestString(t, s, c) }
	cut, whole := ingest("seventeen bytes!\n"), ingest("whole")
	cut.Path = "cut.bin"
	for i, r := range []*Record{
		{Key: "a", Pipeline: "p", Stage: "one", Kind: "merge", Params: []byte(`{}`), Outputs: []Output{cut}},
		{Key: "b", Pipeline: "p", Stage: "two", Kind: "merge", Params: []byte(`{"x":1}`), Outputs: []Output{cut}},
		{Key: "imp", Pipeline: "p", Stage: "base", Kind: "import", Params: []byte(`{}`), Sources: map[string]Stamp{"/nowhere": {}},
			Outputs: []Output{{Path: "w", Digest: whole.Digest, Size: whole.Size}}},
	} {
		if err := s.Commit(r); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	// A record that lies about a size (Commit refuses to write one).
	s.m.Records["imp"].Outputs[0].Size++
	p := s.BlobPath(cut.Digest)
	os.Chmod(p, 0o644)
	if err := os.Truncate(p, 5); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.Root, "blobs", Algorithm)
	os.WriteFile(filepath.Join(dir, "junk"), []byte("junk"), 0o644)
	os.Symlink("/nowhere", filepath.Join(dir, "junk-link"))
	os.MkdirAll(filepath.Join(dir, "junk-dir"), 0o755)
	os.WriteFile(filepath.Join(dir, "junk-dir", "f"), []byte("f"), 0o644)

	rep, err := s.Verify(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, pr := range rep.Problems {
		got = append(got, pr.String())
	}
	want := []string{
		"blob " + cut.Digest.Short() + ": content does not match its digest",
		"blob " + cut.Digest.Short() + ": stage one output " + cut.Path + ": blob damaged",
		"blob " + cut.Digest.Short() + ": stage two output " + cut.Path + ": blob damaged",
		"blob " + whole.Digest.Short() + ": stage base output w: blob holds 5 bytes, the record says 6",
		"stray entry in the blob directory", "stray entry in the blob directory", "stray entry in the blob directory",
	}
	if len(got) != len(want) {
		t.Fatalf("%d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	strays := map[string]bool{}
	for _, pr := range rep.Problems {
		if pr.Path != "" {
			strays[filepath.Base(pr.Path)] = true
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
			t.Errorf("no problem %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if !strays["junk"] || !strays["junk-link"] || !strays["junk-dir"] {
		t.Errorf("strays reported: %v", strays)
	}
	if !strings.Contains(s.Damage(cut.Digest), "does not match") {
		t.Errorf("the cut blob's mark: %q", s.Damage(cut.Digest))
	}
	if !strings.Contains(s.Damage(whole.Digest), "size differs") {
		t.Errorf("the resized import's mark: %q", s.Damage(whole.Digest))
	}

	g, err := s.GC(false)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBlobs != 2 || g.RemovedBytes != 4 {
		t.Errorf("gc of the strays: %+v", g)
	}
	for name, want := range map[string]bool{"junk": false, "junk-link": false, "junk-dir": true} {
		if _, err := os.Lstat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s after gc: %v", name, err)
		}
	}
}

// ingestString stores c as a blob of s: the output named c.
func ingestString(t *testing.T, s *Store, c string) Output {
	t.Helper()
	d, n, err := s.Ingest(strings.NewReader(c), -1)
	if err != nil {
		t.Fatal(err)
	}
	return Output{Path: c, Digest: d, Size: n}
}

// A gc killed while it held the store's gc lease does not hold up the next
// one on the directory (under its lock, the lease is this directory's):
// the next takes the lease over at once.
func TestGCAfterKilledGC(t *testing.T) {
	s := openTemp(t)
	ingestString(t, s, "a blob")
	if err := s.Commit(&Record{Key: "k", Pipeline: "p", Stage: "x", Kind: "merge", Params: []byte(`{}`), Outputs: []Output{ingestString(t, s, "made")}}); err != nil {
		t.Fatal(err)
	}
	ctx, die := context.WithCancel(context.Background())
	if _, err := s.Objects().AcquireLease(ctx, "gc", time.Minute); err != nil {
		t.Fatal(err)
	}
	die() // killed: not released, not renewed
	next, err := Open(s.Root)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := next.GC(false)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second || rep.RemovedBlobs != 1 {
		t.Errorf("gc after a killed gc: %+v in %v", rep, took)
	}
}

// A copy into a pipeline's directory killed mid-fetch leaves its partial
// in the store's own temp directory: du counts it, and gc removes it past
// the grace period (a resumed copy continues from a younger one).
func TestGCKilledCopyTemp(t *testing.T) {
	s := openTemp(t)
	objs, err := s.objects()
	if err != nil {
		t.Fatal(err)
	}
	if err := objs.PutBlob(context.Background(), digest.Of([]byte("x")), strings.NewReader("x"), 1, nil); err != nil {
		t.Fatal(err) // the store's temp directory made, as a copy does
	}
	tmp := filepath.Join(s.Root, ".tmp")
	old, young := filepath.Join(tmp, "copy-0a.partial"), filepath.Join(tmp, "copy-0b.partial")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, make([]byte, 1000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	then := time.Now().Add(-2 * store.DefaultGCGrace)
	os.Chtimes(old, then, then)
	du, err := s.DiskUsage()
	if err != nil || du.TempBytes < 2000 {
		t.Fatalf("du: temp %d bytes, %v", du.TempBytes, err)
	}
	rep, err := s.GC(false)
	if err != nil || rep.RemovedTemp < 1 {
		t.Fatalf("gc: %+v, %v", rep, err)
	}
	if _, err := os.Stat(old); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the old partial is still there: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("the young partial went: %v", err)
	}
}
