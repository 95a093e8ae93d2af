package fsutil

import "errors"

// ErrCloneUnsupported means the file system cannot clone src to dst (no
// reflinks, or the two are on different file systems): the caller falls
// back to something else. Clone leaves no dst behind in that case.
var ErrCloneUnsupported = errors.New("file system cannot clone (reflink) this file")

// Clone makes dst, which must not exist, a copy-on-write clone of the
// regular file src where the file system can (FICLONE on Linux: Btrfs,
// XFS with reflink, bcachefs, …; clonefile on macOS: APFS): the clone
// shares src's blocks, so it takes no time and no space until one of the two
// is written, and it is a file of its own (changing src later does not
// change it). Anywhere else it returns an error wrapping
// ErrCloneUnsupported.
func Clone(src, dst string) error { return clone(src, dst) }
