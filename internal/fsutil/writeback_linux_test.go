package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

// A writeback request that races Close/Abort/Detach (a write passed its
// state check, then the writer stopped the goroutine) is dropped, not a
// send on a closed channel; stopping twice is harmless.
func TestWritebackRequestAfterStop(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wb := NewWriteback(f)
	wb.Wrote(WritebackEvery) // takes the request path
	wb.Stop()
	wb.Wrote(WritebackEvery)
	wb.Stop()
}
