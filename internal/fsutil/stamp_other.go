//go:build !unix

package fsutil

import "io/fs"

func inodeOf(fs.FileInfo) uint64 { return 0 }
