package gguf

import (
	"os"
	"path/filepath"
	"testing"
)

// A writeback request that races Close/Abort/Detach (WriteAt passed its
// state check, then the writer stopped the flusher) is dropped, not a send
// on a closed channel; stopping twice is harmless.
func TestFlusherRequestAfterStop(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fl := newFlusher(f)
	fl.request()
	fl.stop()
	fl.request()
	fl.stop()
	w := &Writer{f: f, fl: fl}
	w.startWriteback(writebackEvery) // takes the request path
}
