package transfer

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS makes every write to dir's file system durable: one syncfs.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// Magic numbers of the network file systems (statfs f_type), from the
// kernel's include/uapi/linux/magic.h and the file systems' own sources.
var networkMagic = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x65735546: "fuse",
	0x01021997: "9p",
	0x00C36400: "ceph",
	0x47504653: "gpfs",
	0x0BD00BD0: "lustre",
	0x013111A8: "ibrix",
	0x6B414653: "afs",
}

// networkFS says whether dir is on a network file system, where a re-read
// must skip the page cache to see what the server holds.
func networkFS(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	_, ok := networkMagic[int64(st.Type)]
	return ok
}

// dropCache asks the kernel to forget the cached pages of f's range, so the
// next read goes to the file system's server.
func dropCache(f *os.File, off, n int64) {
	_ = unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}

// startWriteback asks the kernel to start writing f's range to its disk
// without waiting for it (sync_file_range SYNC_FILE_RANGE_WRITE): only a
// head start for the syncfs that makes it durable, so errors are left to
// that.
func startWriteback(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}
