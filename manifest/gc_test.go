package manifest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
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
	ingest := func(c string) Output {
		d, n, err := s.Ingest(strings.NewReader(c), -1)
		if err != nil {
			t.Fatal(err)
		}
		return Output{Path: c, Digest: d, Size: n}
	}
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

	g, err := s.GC(false)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBlobs != 1 || g.RemovedBytes != orphan.Size || g.KeptBlobs != 2 || g.AbortedUploads != 1 {
		t.Fatalf("gc: %+v", g)
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
