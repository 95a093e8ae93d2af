//go:build unix

package fsutil

import "golang.org/x/sys/unix"

// FreeSpace is the space an unprivileged user may still write in the file
// system holding dir (statfs f_bavail × f_bsize); ok is false where the
// platform cannot tell.
func FreeSpace(dir string) (free int64, ok bool, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, false, err
	}
	return int64(st.Bavail) * int64(st.Bsize), true, nil
}
