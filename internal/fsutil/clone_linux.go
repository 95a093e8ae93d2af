package fsutil

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func clone(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		switch {
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL),
			errors.Is(err, unix.ENOTTY), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
			return fmt.Errorf("clone %s: %w (%v)", src, ErrCloneUnsupported, err)
		}
		return fmt.Errorf("clone %s to %s: %w", src, dst, err)
	}
	return nil
}
