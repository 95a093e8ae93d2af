package fsutil

import (
	"io/fs"
	"os"
)

// Stamp is the cheap identity of a file on disk: size, modification time and
// inode. A file whose stamp still matches the one recorded when it was
// written (or last verified) is taken as intact without re-reading it.
type Stamp struct {
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	Inode   uint64 `json:"inode,omitempty"`
}

// StampOf builds the stamp of fi.
func StampOf(fi fs.FileInfo) Stamp {
	return Stamp{Size: fi.Size(), MtimeNs: fi.ModTime().UnixNano(), Inode: inodeOf(fi)}
}

// StatStamp stats path (following symlinks) and returns its stamp.
func StatStamp(path string) (Stamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Stamp{}, err
	}
	return StampOf(fi), nil
}
