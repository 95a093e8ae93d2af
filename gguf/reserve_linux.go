package gguf

import "golang.org/x/sys/unix"

// reserve allocates the file's blocks up front (fallocate), so a disk too
// small for the output fails at Create instead of part-way through.
func reserve(fd uintptr, size int64) error {
	err := unix.Fallocate(int(fd), 0, 0, size)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		return nil // the filesystem cannot preallocate; Truncate sizes the file
	}
	return err
}
