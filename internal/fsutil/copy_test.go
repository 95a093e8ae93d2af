package fsutil

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/internal/hashing"
)

// TestCopyAtomic: the copy is byte-identical with the digest of its bytes;
// a failed copy (missing source, canceled) leaves the target untouched and
// no temp file.
func TestCopyAtomic(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := bytes.Repeat([]byte("0123456789abcdef"), 200000)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	var seen int64
	d, n, err := CopyAtomic(t.Context(), dst, src, func(k int64) { seen += k })
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, data) || d != hashing.Digest(sha256.Sum256(data)) || n != int64(len(data)) || seen != n {
		t.Errorf("copy: %d bytes equal=%v digest %s n %d progress %d", len(got), bytes.Equal(got, data), d.Hex(), n, seen)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != DefaultPerm {
		t.Errorf("mode %v", fi.Mode())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, run := range map[string]func() error{
		"missing source": func() error { _, _, err := CopyAtomic(t.Context(), dst, filepath.Join(dir, "none"), nil); return err },
		"canceled":       func() error { _, _, err := CopyAtomic(ctx, dst, src, nil); return err },
	} {
		os.WriteFile(dst, []byte("old"), 0o644)
		if err := run(); err == nil {
			t.Errorf("%s: no error", name)
		}
		if b, _ := os.ReadFile(dst); string(b) != "old" {
			t.Errorf("%s: target changed", name)
		}
		if tmp, _ := filepath.Glob(filepath.Join(dir, "*"+PartialSuffix)); len(tmp) > 0 {
			t.Errorf("%s: temp files left: %v", name, tmp)
		}
		if tmp, _ := filepath.Glob(filepath.Join(dir, ".*"+PartialSuffix)); len(tmp) > 0 {
			t.Errorf("%s: temp files left: %v", name, tmp)
		}
	}
	if _, _, err := CopyAtomic(ctx, dst, src, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
}
