package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestAtomicFile(t *testing.T) {
	tests := []struct {
		name    string
		do      func(a *AtomicFile) error
		wantErr bool
		want    string // content under the final name; "" for no file
		perm    os.FileMode
	}{
		{"commit", func(a *AtomicFile) error { a.WriteString("hello"); return a.Commit() }, false, "hello", DefaultPerm},
		{"commit with perm", func(a *AtomicFile) error { a.WriteString("x"); a.SetPerm(0o600); return a.Commit() }, false, "x", 0o600},
		{"abort", func(a *AtomicFile) error { a.WriteString("hello"); a.Abort(); return nil }, false, "", 0},
		{"commit twice", func(a *AtomicFile) error { a.Commit(); return a.Commit() }, true, "", 0},
		{"abort after commit is a no-op", func(a *AtomicFile) error { a.WriteString("y"); err := a.Commit(); a.Abort(); return err }, false, "y", DefaultPerm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "out.bin")
			a, err := CreateAtomic(target)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Dir(a.Name()) != dir || !strings.HasSuffix(a.Name(), PartialSuffix) || a.Target() != target {
				t.Fatalf("temp %q target %q", a.Name(), a.Target())
			}
			if _, err := os.Stat(target); !os.IsNotExist(err) {
				t.Fatal("target exists before Commit")
			}
			err = tt.do(a)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v", err)
			}
			names := listDir(t, dir)
			if tt.want == "" && !tt.wantErr {
				if len(names) != 0 {
					t.Errorf("directory holds %v, want nothing", names)
				}
				return
			}
			if tt.wantErr {
				return
			}
			if len(names) != 1 || names[0] != "out.bin" {
				t.Errorf("directory holds %v", names)
			}
			b, err := os.ReadFile(target)
			if err != nil || string(b) != tt.want {
				t.Errorf("content %q %v", b, err)
			}
			if st, _ := os.Stat(target); st.Mode().Perm() != tt.perm {
				t.Errorf("mode %v, want %v", st.Mode().Perm(), tt.perm)
			}
		})
	}
}

func TestCommitReplacesAndFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "f")
	if err := WriteFileAtomic(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(target, []byte("new"), 0o640); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "new" {
		t.Errorf("content %q", b)
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", st.Mode())
	}
	// Renaming onto a directory fails: the old target stays, no temp file.
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	os.WriteFile(filepath.Join(sub, "keep"), nil, 0o644)
	if err := WriteFileAtomic(sub, []byte("x"), 0o644); err == nil {
		t.Error("replacing a non-empty directory succeeded")
	}
	for _, n := range listDir(t, dir) {
		if strings.HasSuffix(n, PartialSuffix) {
			t.Errorf("temp file %s left behind", n)
		}
	}
	if _, err := CreateAtomic(filepath.Join(dir, "missing", "f")); err == nil {
		t.Error("CreateAtomic in a missing directory succeeded")
	}
	if err := SyncDir(dir); err != nil {
		t.Error(err)
	}
}

// Errors name the target the caller asked for, not the temp file; a
// directory as target fails before anything is written.
func TestCreateAtomicErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "out.bin")
	_, err := CreateAtomic(missing)
	if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), missing+": ") || strings.Contains(err.Error(), PartialSuffix) {
		t.Errorf("missing parent: %v", err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateAtomic(sub); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("directory target: %v", err)
	}
	if names := listDir(t, dir); len(names) != 1 {
		t.Errorf("directory holds %v, want just sub", names)
	}
}
