package fsutil

import (
	"path/filepath"
	"runtime"
	"testing"
)

// FreeSpace reads some free space, below the 1 EiB no test machine has,
// for a temporary directory, and fails on a directory that does not exist.
func TestFreeSpace(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("statfs is read on unix only")
	}
	dir := t.TempDir()
	free, ok, err := FreeSpace(dir)
	if err != nil || !ok || free <= 0 || free > 1<<60 {
		t.Fatalf("FreeSpace(%s) = %d, %v, %v", dir, free, ok, err)
	}
	if _, _, err := FreeSpace(filepath.Join(dir, "missing")); err == nil {
		t.Error("FreeSpace of a missing directory: no error")
	}
}
