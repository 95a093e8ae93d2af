//go:build !linux && !darwin

package fsutil

import "fmt"

func clone(src, dst string) error {
	return fmt.Errorf("clone %s: %w", src, ErrCloneUnsupported)
}
