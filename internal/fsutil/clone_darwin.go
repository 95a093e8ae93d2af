package fsutil

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

func clone(src, dst string) error {
	// A src that is a symlink (a Hugging Face snapshot file) is followed:
	// the clone is of the file's content.
	if err := unix.Clonefile(src, dst, unix.CLONE_NOOWNERCOPY); err != nil {
		switch {
		case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
			return fmt.Errorf("clone %s: %w (%v)", src, ErrCloneUnsupported, err)
		}
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}
