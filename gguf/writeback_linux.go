package gguf

import "golang.org/x/sys/unix"

// writebackEvery is how many bytes the writer lets accumulate before it
// asks the kernel to start writing them out.
const writebackEvery = 64 << 20

// startWriteback asks the kernel to start writing dirty pages to disk now
// (sync_file_range SYNC_FILE_RANGE_WRITE over the whole file, which does
// not wait for completion) once writebackEvery bytes were written since
// the last request, so the final fsync does not find the whole file dirty.
func (w *Writer) startWriteback(off, n int64) {
	if w.pending.Add(n) < writebackEvery {
		return
	}
	w.pending.Store(0)
	unix.SyncFileRange(int(w.f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
}

// reserve allocates the file's blocks up front (fallocate), so a disk too
// small for the output fails at Create instead of part-way through.
func reserve(fd uintptr, size int64) error {
	err := unix.Fallocate(int(fd), 0, 0, size)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		return nil // the filesystem cannot preallocate; Truncate sizes the file
	}
	return err
}
