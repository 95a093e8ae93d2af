package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckLinks(t *testing.T) {
	hex64 := strings.Repeat("ab", 32)
	tests := []struct {
		name string
		// build lays out root/model (and whatever else) and returns the
		// link that must be refused, "" when the dir must be accepted.
		build func(t *testing.T, root, model string) string
	}{
		{"no links", func(t *testing.T, root, model string) string { return "" }},
		{"link inside", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(model, "sub", "a"))
			symlink(t, filepath.Join("sub", "a"), filepath.Join(model, "b"))
			return ""
		}},
		{"file outside", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "secret"))
			return symlink(t, filepath.Join(root, "secret"), filepath.Join(model, "notes.txt"))
		}},
		{"relative, out and back in", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(model, "a"))
			symlink(t, filepath.Join("..", "model", "a"), filepath.Join(model, "b"))
			return ""
		}},
		{"directory outside", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "etc", "passwd"))
			return symlink(t, filepath.Join(root, "etc"), filepath.Join(model, "sub"))
		}},
		{"outside, in a subdirectory", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "secret"))
			return symlink(t, filepath.Join(root, "secret"), filepath.Join(model, "sub", "deep", "x"))
		}},
		{"hidden entries are not read", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "secret"))
			symlink(t, filepath.Join(root, "secret"), filepath.Join(model, ".cache", "x"))
			symlink(t, filepath.Join(root, "secret"), filepath.Join(model, ".notes"))
			return ""
		}},
		{"broken link (its reader reports it)", func(t *testing.T, root, model string) string {
			symlink(t, filepath.Join(root, "gone"), filepath.Join(model, "x"))
			return ""
		}},
		{"Hugging Face blob", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "hub", "blobs", hex64[:40]))
			symlink(t, filepath.Join(root, "hub", "blobs", hex64[:40]), filepath.Join(model, "config.json"))
			return ""
		}},
		{"a directory named blobs is not enough", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "blobs", "passwd"))
			return symlink(t, filepath.Join(root, "blobs", "passwd"), filepath.Join(model, "config.json"))
		}},
		{"ferry store blob that is an in-place link", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "store", "manifest.json"))
			mkfile(t, filepath.Join(root, "user", "w.bin"))
			symlink(t, filepath.Join(root, "user", "w.bin"), filepath.Join(root, "store", "blobs", "sha256", hex64))
			symlink(t, filepath.Join("..", "store", "blobs", "sha256", hex64), filepath.Join(model, "w.bin"))
			return ""
		}},
		{"store-like path without a manifest", func(t *testing.T, root, model string) string {
			mkfile(t, filepath.Join(root, "secret"))
			symlink(t, filepath.Join(root, "secret"), filepath.Join(root, "store", "blobs", "sha256", hex64))
			return symlink(t, filepath.Join(root, "store", "blobs", "sha256", hex64), filepath.Join(model, "w.bin"))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			model := filepath.Join(root, "model")
			mkfile(t, filepath.Join(model, "config.json.orig"))
			bad := tc.build(t, root, model)
			err := CheckLinks(model)
			var le *LinkError
			switch {
			case bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case bad != "" && (!errors.As(err, &le) || le.Path != bad || !errors.Is(err, ErrLinkOutside)):
				t.Fatalf("got %v, want a LinkError for %s", err, bad)
			}
		})
	}
}

func mkfile(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	return p
}
