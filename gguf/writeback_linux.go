package gguf

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// writebackEvery is how many bytes the writer lets accumulate before it
// asks the kernel to start writing them out.
const writebackEvery = 64 << 20

// flusher asks the kernel, from a goroutine of its own, to start writing
// the file's dirty pages to disk (sync_file_range SYNC_FILE_RANGE_WRITE
// over the whole file, which does not wait for the data to reach the
// disk). Writeback then runs alongside the conversion instead of all at
// the final fsync, and the writers never stall in the call: submitting
// writeback costs CPU and blocks while the device queue is full.
type flusher struct {
	mu      sync.Mutex
	stopped bool
	kick    chan struct{}
	done    chan struct{}
}

func newFlusher(f *os.File) *flusher {
	fl := &flusher{kick: make(chan struct{}, 1), done: make(chan struct{})}
	fd := int(f.Fd())
	go func() {
		defer close(fl.done)
		for range fl.kick {
			unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
	}()
	return fl
}

// request wakes the flusher unless a request is pending or it stopped
// (a WriteAt racing a Close, Abort or Detach).
func (fl *flusher) request() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.stopped {
		return
	}
	select {
	case fl.kick <- struct{}{}:
	default:
	}
}

// stop waits for a request in progress; the file may then be closed.
// Calling it again is a no-op.
func (fl *flusher) stop() {
	if fl == nil {
		return
	}
	fl.mu.Lock()
	if fl.stopped {
		fl.mu.Unlock()
		return
	}
	fl.stopped = true
	close(fl.kick)
	fl.mu.Unlock()
	<-fl.done
}

// startWriteback notes n more bytes written and, every writebackEvery
// bytes, wakes the flusher (a request already pending covers these too).
func (w *Writer) startWriteback(n int64) {
	if w.pending.Add(n) < writebackEvery {
		return
	}
	w.pending.Store(0)
	w.fl.request()
}

// reserve allocates the file's blocks up front (fallocate), so a disk too
// small for the output fails at Create instead of part-way through.
func reserve(fd uintptr, size int64) error {
	err := unix.Fallocate(int(fd), 0, 0, size)
	if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		return nil // the filesystem cannot preallocate; Truncate sizes the file
	}
	return err
}
