package fsutil

import (
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// WritebackEvery is how many bytes a Writeback lets accumulate before it
// asks the kernel to start writing them out.
const WritebackEvery = 64 << 20

// Writeback asks the kernel, from a goroutine of its own, to start writing
// a file's dirty pages to disk every WritebackEvery bytes written
// (sync_file_range SYNC_FILE_RANGE_WRITE over the whole file, which does
// not wait for the data to reach the disk). Writeback then runs alongside
// the work instead of all at the final fsync, and the writers never stall
// in the call: submitting writeback costs CPU and blocks while the device
// queue is full. Elsewhere than on Linux it does nothing (a nil
// *Writeback), and the final fsync writes everything.
type Writeback struct {
	pending atomic.Int64 // bytes written since the last request
	mu      sync.Mutex
	stopped bool
	kick    chan struct{}
	done    chan struct{}
}

// NewWriteback starts the writeback goroutine of f; Stop ends it, before f
// is closed.
func NewWriteback(f *os.File) *Writeback {
	wb := &Writeback{kick: make(chan struct{}, 1), done: make(chan struct{})}
	fd := int(f.Fd())
	go func() {
		defer close(wb.done)
		for range wb.kick {
			unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
		}
	}()
	return wb
}

// Wrote notes n more bytes written to the file and, every WritebackEvery
// bytes, wakes the goroutine (a request already pending covers these
// too). It may be called from any goroutine.
func (wb *Writeback) Wrote(n int64) {
	if wb == nil || wb.pending.Add(n) < WritebackEvery {
		return
	}
	wb.pending.Store(0)
	wb.request()
}

// request wakes the goroutine unless a request is pending or it stopped
// (a write racing a Close, Abort or Detach).
func (wb *Writeback) request() {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if wb.stopped {
		return
	}
	select {
	case wb.kick <- struct{}{}:
	default:
	}
}

// Stop waits for a request in progress; the file may then be closed.
// Calling it again is a no-op.
func (wb *Writeback) Stop() {
	if wb == nil {
		return
	}
	wb.mu.Lock()
	if wb.stopped {
		wb.mu.Unlock()
		return
	}
	wb.stopped = true
	close(wb.kick)
	wb.mu.Unlock()
	<-wb.done
}
