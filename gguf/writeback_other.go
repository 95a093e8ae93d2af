//go:build !linux

package gguf

import "os"

// flusher does nothing here: the final fsync writes everything.
type flusher struct{}

func newFlusher(f *os.File) *flusher { return nil }

func (fl *flusher) stop() {}

func (w *Writer) startWriteback(n int64) {}

func reserve(fd uintptr, size int64) error { return nil }
