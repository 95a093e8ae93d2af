package manifest

import (
	"io/fs"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// Stamp is the cheap identity of a file on disk (fsutil.Stamp). A blob whose
// stamp still matches the one recorded when it was committed (or last
// verified) is taken as intact without re-reading it; `--verify` re-hashes
// instead.
type Stamp = fsutil.Stamp

// StampOf builds the stamp of fi.
func StampOf(fi fs.FileInfo) Stamp { return fsutil.StampOf(fi) }

// StatStamp stats path (following symlinks) and returns its stamp.
func StatStamp(path string) (Stamp, error) { return fsutil.StatStamp(path) }
