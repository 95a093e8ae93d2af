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
)

func openTemp(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestIngest(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		size    int64
		wantErr error
	}{
		{"empty", nil, 0, nil},
		{"small", []byte("hello"), 5, nil},
		{"unchecked size", []byte("hello"), -1, nil},
		{"short", []byte("hell"), 5, ErrSizeMismatch},
		{"long", []byte("hello!"), 5, ErrSizeMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := openTemp(t)
			d, n, err := s.Ingest(bytes.NewReader(tc.data), tc.size)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			tmp, _ := os.ReadDir(filepath.Join(s.Root, "tmp"))
			if len(tmp) != 0 {
				t.Errorf("temp files left: %v", tmp)
			}
			if tc.wantErr != nil {
				blobs, _ := os.ReadDir(filepath.Join(s.Root, "blobs", Algorithm))
				if len(blobs) != 0 {
					t.Errorf("a failed ingest left blobs: %v", blobs)
				}
				return
			}
			sum := sha256.Sum256(tc.data)
			if d != NewDigest(sum[:]) || n != int64(len(tc.data)) {
				t.Fatalf("got %s %d", d, n)
			}
			fi, err := os.Stat(s.BlobPath(d))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm()&0o222 != 0 {
				t.Errorf("blob mode %v is writable", fi.Mode())
			}
			got, _ := os.ReadFile(s.BlobPath(d))
			if !bytes.Equal(got, tc.data) {
				t.Error("blob content differs")
			}
			if why := s.CheckBlob(d, n, false); why != "" {
				t.Errorf("fresh blob: %s", why)
			}
			if why := s.CheckBlob(d, n, true); why != "" {
				t.Errorf("fresh blob rehash: %s", why)
			}
		})
	}
}

func TestIngestExistingIsSuccess(t *testing.T) {
	s := openTemp(t)
	d1, _, err := s.Ingest(strings.NewReader("same"), 4)
	if err != nil {
		t.Fatal(err)
	}
	fi1, _ := os.Stat(s.BlobPath(d1))
	d2, _, err := s.Ingest(strings.NewReader("same"), 4)
	if err != nil || d2 != d1 {
		t.Fatalf("second ingest: %v %s", err, d2)
	}
	fi2, _ := os.Stat(s.BlobPath(d1))
	if !os.SameFile(fi1, fi2) {
		t.Error("an intact existing blob was replaced")
	}
	// A damaged blob under that name is replaced by the good bytes.
	p := s.BlobPath(d1)
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("SAME"), 0o644)
	if why := s.CheckBlob(d1, 4, true); why == "" {
		t.Fatal("damage not seen by rehash")
	}
	if _, _, err := s.Ingest(strings.NewReader("same"), 4); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "same" {
		t.Errorf("damaged blob not healed: %q", b)
	}
}

func TestWriterDigestCheck(t *testing.T) {
	s := openTemp(t)
	w, err := s.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("abc"))
	if _, _, err := w.Commit(3, DigestOf([]byte("abd"))); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("err %v", err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("write after failed commit succeeded")
	}
}

func TestCommitAndReload(t *testing.T) {
	s := openTemp(t)
	d, n, err := s.Ingest(strings.NewReader("payload"), -1)
	if err != nil {
		t.Fatal(err)
	}
	rec := &Record{Key: "k1", Pipeline: "p", Stage: "a", Kind: "import", Params: []byte(`{"path":"/x"}`),
		Outputs: []Output{{Path: "dir/file", Digest: d, Size: n}}}
	if err := s.Commit(rec); err != nil {
		t.Fatal(err)
	}
	// A record that refers to a blob that is not there is refused.
	bad := &Record{Key: "k2", Pipeline: "p", Stage: "b", Params: []byte(`{}`),
		Outputs: []Output{{Path: "f", Digest: DigestOf([]byte("nope")), Size: 4}}}
	if err := s.Commit(bad); err == nil {
		t.Fatal("commit with a dangling output succeeded")
	}
	s2, err := Load(s.Root)
	if err != nil {
		t.Fatal(err)
	}
	got := s2.StageRecord("p", "a")
	if got == nil || got.Status != StatusComplete || got.Outputs[0].Digest != d {
		t.Fatalf("reloaded %+v", got)
	}
	if s2.StageRecord("p", "b") != nil {
		t.Error("refused record was saved")
	}
	if why := s2.CheckBlob(d, n, false); why != "" {
		t.Errorf("after reload: %s", why)
	}
}

func TestView(t *testing.T) {
	s := openTemp(t)
	d1, n1, _ := s.Ingest(strings.NewReader("one"), -1)
	d2, n2, _ := s.Ingest(strings.NewReader("two"), -1)
	view := filepath.Join(filepath.Dir(s.Root), "out", "v")
	outs := []Output{{Path: "a.txt", Digest: d1, Size: n1}, {Path: "sub/b.txt", Digest: d2, Size: n2}}
	if err := s.MakeView(view, outs); err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		link := filepath.Join(view, o.Path)
		target, err := os.Readlink(link)
		if err != nil || filepath.IsAbs(target) {
			t.Fatalf("%s: link %q %v, want relative", o.Path, target, err)
		}
		b, err := os.ReadFile(link)
		if err != nil {
			t.Fatal(err)
		}
		if DigestOf(b) != o.Digest {
			t.Errorf("%s reads wrong bytes", o.Path)
		}
	}
	if why := s.CheckView(view, outs); why != "" {
		t.Error(why)
	}
	// Re-view with one output: the stale link goes, user files stay.
	os.WriteFile(filepath.Join(view, "mine.txt"), []byte("user"), 0o644)
	if err := s.MakeView(view, outs[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(view, "sub/b.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Error("stale link kept")
	}
	if _, err := os.Stat(filepath.Join(view, "mine.txt")); err != nil {
		t.Error("user file removed")
	}
	// A user file where an output goes is not overwritten.
	if err := s.MakeView(view, []Output{{Path: "mine.txt", Digest: d1, Size: n1}}); !errors.Is(err, ErrViewConflict) {
		t.Errorf("err %v, want ErrViewConflict", err)
	}
}

func TestJournalResume(t *testing.T) {
	units := [][]byte{bytes.Repeat([]byte("a"), 1000), bytes.Repeat([]byte("b"), 777), bytes.Repeat([]byte("c"), 5)}
	var all []byte
	for _, u := range units {
		all = append(all, u...)
	}
	want := DigestOf(all)
	// Stop after k units (plus a partial unit), reopen, finish.
	for k := 0; k <= len(units); k++ {
		s := openTemp(t)
		j, err := s.OpenJournal("key", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < k; i++ {
			j.Write(units[i])
			if err := j.EndUnit(string(rune('A' + i))); err != nil {
				t.Fatal(err)
			}
		}
		j.Write([]byte("partial garbage"))
		j.Close()
		// A torn journal line (crash inside an append) is ignored.
		jf, _ := os.OpenFile(filepath.Join(s.IngestDir("key"), DigestOf([]byte("big.bin")).Short(), "journal"), os.O_APPEND|os.O_WRONLY, 0)
		jf.Write([]byte(`{"unit":"X","end":99`))
		jf.Close()

		j, err = s.OpenJournal("key", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		if got := len(j.Units()); got != k {
			t.Fatalf("k=%d: resumed with %d units", k, got)
		}
		var off int64
		for i := 0; i < k; i++ {
			off += int64(len(units[i]))
		}
		if j.Offset() != off {
			t.Fatalf("offset %d, want %d", j.Offset(), off)
		}
		for i := k; i < len(units); i++ {
			j.Write(units[i])
			j.EndUnit(string(rune('A' + i)))
		}
		o, err := j.Commit(int64(len(all)))
		if err != nil {
			t.Fatal(err)
		}
		j.Close()
		if o.Digest != want {
			t.Fatalf("k=%d: digest %s, want %s", k, o.Digest, want)
		}
		if b, _ := os.ReadFile(s.BlobPath(o.Digest)); !bytes.Equal(b, all) {
			t.Fatal("blob bytes differ")
		}
		// Reopened after commit (record not yet written): committed, no redo.
		j, err = s.OpenJournal("key", "big.bin")
		if err != nil {
			t.Fatal(err)
		}
		if o2, ok := j.Committed(); !ok || o2 != o {
			t.Fatalf("committed journal not recognised: %v %+v", ok, o2)
		}
		j.Close()
		if err := s.RemoveIngest("key"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestJournalDoesNotRereadFinishedUnits(t *testing.T) {
	s := openTemp(t)
	j, _ := s.OpenJournal("k", "f")
	j.Write([]byte("hello "))
	j.EndUnit("u0")
	j.Close()
	// Corrupt the finished bytes on disk: a resume that re-read them would
	// hash "HELLO "; one that continues the stored hash state does not.
	dp := filepath.Join(s.IngestDir("k"), DigestOf([]byte("f")).Short(), "data")
	os.WriteFile(dp, []byte("HELLO "), 0o644)
	j, _ = s.OpenJournal("k", "f")
	j.Write([]byte("world"))
	j.EndUnit("u1")
	o, err := j.Commit(-1)
	if err != nil {
		t.Fatal(err)
	}
	if o.Digest != DigestOf([]byte("hello world")) {
		t.Fatal("resume re-read finished units instead of restoring the hash state")
	}
}

func TestLock(t *testing.T) {
	s := openTemp(t)
	l, err := s.TryLock("first")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.TryLock("second")
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) || le.Holder.PID != os.Getpid() && le.Holder.Command != "first" {
		t.Fatalf("second lock: %v", err)
	}
	if !strings.Contains(err.Error(), "store is locked by pid") {
		t.Errorf("message %q", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.LockPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("unlock left the lock file")
	}

	// LockWait gets the lock once it is released.
	l, _ = s.TryLock("holder")
	go func() { time.Sleep(300 * time.Millisecond); l.Unlock() }()
	l2, err := s.LockWait(context.Background(), "waiter", 5*time.Second)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	l2.Unlock()
}

func TestVerifyAndGC(t *testing.T) {
	s := openTemp(t)
	var outs []Output
	for _, c := range []string{"alpha", "beta", "gamma"} {
		d, n, err := s.Ingest(strings.NewReader(c), -1)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, Output{Path: c, Digest: d, Size: n})
	}
	garbage, _, _ := s.Ingest(strings.NewReader("garbage"), -1)
	if err := s.Commit(&Record{Key: "k", Pipeline: "p", Stage: "st", Params: []byte(`{}`), Outputs: outs}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Verify(context.Background(), nil)
	if err != nil || !rep.OK() || rep.Blobs != 4 || rep.Unreferenced != 1 {
		t.Fatalf("clean verify: %+v %v", rep, err)
	}
	// Flip a byte (keeping size and mtime: the stamp cannot see it) and
	// delete another blob.
	flip := s.BlobPath(outs[0].Digest)
	fi, _ := os.Stat(flip)
	os.Chmod(flip, 0o644)
	b, _ := os.ReadFile(flip)
	b[2] ^= 1
	os.WriteFile(flip, b, 0o644)
	os.Chtimes(flip, fi.ModTime(), fi.ModTime())
	os.Remove(s.BlobPath(outs[1].Digest))
	rep, err = s.Verify(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || len(rep.Problems) != 3 { // flipped blob, plus the record's two bad outputs
		t.Fatalf("problems %v", rep.Problems)
	}
	// The damage is recorded, so a later check without re-hashing sees it.
	s2, _ := Load(s.Root)
	if why := s2.CheckBlob(outs[0].Digest, outs[0].Size, false); !strings.Contains(why, "damaged") {
		t.Errorf("flipped blob after verify: %q", why)
	}
	if why := s2.CheckBlob(outs[1].Digest, outs[1].Size, false); why == "" {
		t.Error("deleted blob looks intact")
	}
	if why := s2.CheckBlob(outs[2].Digest, outs[2].Size, false); why != "" {
		t.Errorf("intact blob: %s", why)
	}
	// GC removes only the unreferenced blob.
	g, err := s2.GC(false)
	if err != nil {
		t.Fatal(err)
	}
	if g.RemovedBlobs != 1 {
		t.Errorf("gc removed %d blobs", g.RemovedBlobs)
	}
	if _, err := os.Stat(s2.BlobPath(garbage)); !errors.Is(err, fs.ErrNotExist) {
		t.Error("garbage blob kept")
	}
	if _, err := os.Stat(s2.BlobPath(outs[2].Digest)); err != nil {
		t.Error("referenced blob removed")
	}
}

func TestLoadRejectsCorruptManifest(t *testing.T) {
	for name, content := range map[string]string{
		"not json":      "{",
		"wrong version": `{"version": 9}`,
		"bad digest":    `{"version":1,"records":{"k":{"key":"k","outputs":[{"path":"a","digest":"sha256:zz","size":1}]}}}`,
		"escaping path": `{"version":1,"records":{"k":{"key":"k","outputs":[{"path":"../a","digest":"sha256:` + strings.Repeat("0", 64) + `","size":1}]}}}`,
		"key mismatch":  `{"version":1,"records":{"k":{"key":"other"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(content), 0o644)
			if _, err := Load(dir); !errors.Is(err, ErrCorruptManifest) {
				t.Fatalf("err %v", err)
			}
		})
	}
}

// A crash between Commit's rename into the blobs and its journal line must
// not redo the units: the resumed journal finds the blob by its hash state.
func TestJournalCrashAfterRename(t *testing.T) {
	s := openTemp(t)
	j, _ := s.OpenJournal("k", "f")
	j.Write([]byte("all the data"))
	j.EndUnit("u0")
	j.Close()
	dp := filepath.Join(s.IngestDir("k"), DigestOf([]byte("f")).Short(), "data")
	want := DigestOf([]byte("all the data"))
	if err := s.place(dp, want, 12); err != nil {
		t.Fatal(err)
	}
	j, err := s.OpenJournal("k", "f")
	if err != nil {
		t.Fatal(err)
	}
	o, ok := j.Committed()
	if !ok || o.Digest != want || o.Size != 12 {
		t.Fatalf("committed %v %+v", ok, o)
	}
}

// A journal committed by a process that died before the manifest was
// written hands its blob's stamp to the store, so the stage's record made
// by the next run is intact by stamp (and the stage is not redone).
func TestJournalCommittedStampSurvives(t *testing.T) {
	root := filepath.Join(t.TempDir(), "s")
	s, _ := Open(root)
	j, _ := s.OpenJournal("k", "f")
	j.Write([]byte("abc"))
	j.EndUnit("u")
	o, err := j.Commit(3)
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	s2, _ := Open(root) // a new process: the stamp was never saved
	j, _ = s2.OpenJournal("k", "f")
	if _, ok := j.Committed(); !ok {
		t.Fatal("not committed")
	}
	if why := s2.CheckBlob(o.Digest, o.Size, false); why != "" {
		t.Fatalf("blob after resume: %s", why)
	}
}
