//go:build !linux

package fsutil

import "os"

// WritebackEvery is how many bytes a Writeback lets accumulate before it
// asks the kernel to start writing them out (Linux only).
const WritebackEvery = 64 << 20

// Writeback does nothing here: the final fsync writes everything.
type Writeback struct{}

// NewWriteback returns nil: there is no writeback to start.
func NewWriteback(f *os.File) *Writeback { return nil }

// Wrote does nothing.
func (wb *Writeback) Wrote(n int64) {}

// Stop does nothing.
func (wb *Writeback) Stop() {}
