package gguf

import "golang.org/x/sys/unix"

// startWriteback asks the kernel to start writing the range to disk now
// (sync_file_range SYNC_FILE_RANGE_WRITE, which does not wait), so the
// final fsync does not find the whole file dirty.
func (w *Writer) startWriteback(off, n int64) {
	unix.SyncFileRange(int(w.f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
