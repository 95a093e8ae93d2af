package manifest

import (
	"context"
	"path/filepath"
	"time"

	"github.com/ferry-llm/ferry/internal/lockfile"
)

// LockInfo is the content of <store>/lock.
type LockInfo = lockfile.Info

// ErrLocked reports a store held by another live process.
var ErrLocked = lockfile.ErrLocked

// LockedError says who holds the lock.
type LockedError = lockfile.LockedError

// Lock is a held store lock.
type Lock = lockfile.Lock

// LockPath is <root>/lock.
func (s *Store) LockPath() string { return filepath.Join(s.Root, "lock") }

// TryLock takes the store lock or returns a *LockedError. A lock whose
// holder is on this host and no longer alive is stale: it is taken over.
// A lock from another host is never taken over automatically.
func (s *Store) TryLock(command string) (*Lock, error) {
	return lockfile.TryLock(s.LockPath(), "store", command)
}

// LockWait retries TryLock until it succeeds, ctx ends or wait elapses
// (wait <= 0: one try).
func (s *Store) LockWait(ctx context.Context, command string, wait time.Duration) (*Lock, error) {
	return lockfile.Wait(ctx, s.LockPath(), "store", command, wait)
}

// ReadLock returns the current lock holder, if any.
func (s *Store) ReadLock() (*LockInfo, error) { return lockfile.Read(s.LockPath()) }
