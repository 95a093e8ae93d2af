//go:build !unix

package manifest

import "io/fs"

func inodeOf(fs.FileInfo) uint64 { return 0 }
