package manifest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// LockInfo is the content of <store>/lock.
type LockInfo struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	Command string    `json:"command,omitempty"`
}

// ErrLocked reports a store held by another live process.
var ErrLocked = errors.New("store is locked")

// LockedError says who holds the lock.
type LockedError struct {
	Path   string
	Holder LockInfo
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("%s: %v by pid %d on host %s since %s (%s); wait for it to finish, or if that process is gone from another host, remove the lock file",
		e.Path, ErrLocked, e.Holder.PID, e.Holder.Host, e.Holder.Started.Format(time.RFC3339), e.Holder.Command)
}

func (e *LockedError) Unwrap() error { return ErrLocked }

// Lock is a held store lock.
type Lock struct {
	path string
	info LockInfo
	// TookOver is the stale lock this one replaced, if any.
	TookOver *LockInfo
}

// LockPath is <root>/lock.
func (s *Store) LockPath() string { return filepath.Join(s.Root, "lock") }

// hostname is a variable so tests can pretend to be another host.
var hostname = os.Hostname

// TryLock takes the store lock or returns a *LockedError. A lock whose
// holder is on this host and no longer alive is stale: it is taken over.
// A lock from another host is never taken over automatically.
func (s *Store) TryLock(command string) (*Lock, error) {
	host, _ := hostname()
	info := LockInfo{PID: os.Getpid(), Host: host, Started: time.Now().UTC(), Command: command}
	b, _ := json.Marshal(info)
	lp := s.LockPath()
	var tookOver *LockInfo
	for attempt := 0; attempt < 5; attempt++ {
		// Write the content under a temp name, then link it to the lock
		// name: the lock appears complete or not at all.
		tmp, err := os.CreateTemp(s.Root, ".lock-*")
		if err != nil {
			return nil, err
		}
		_, werr := tmp.Write(b)
		if werr == nil {
			werr = tmp.Sync()
		}
		tmp.Close()
		if werr != nil {
			os.Remove(tmp.Name())
			return nil, werr
		}
		err = os.Link(tmp.Name(), lp)
		os.Remove(tmp.Name())
		if err == nil {
			held.Store(lp, true)
			return &Lock{path: lp, info: info, TookOver: tookOver}, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%s: %w", lp, err)
		}
		holder, raw, rerr := readLock(lp)
		if errors.Is(rerr, fs.ErrNotExist) {
			continue // released meanwhile
		}
		if rerr != nil {
			return nil, fmt.Errorf("%s: unreadable lock file: %w", lp, rerr)
		}
		// Our own pid holds it only if this process took it (heldHere);
		// otherwise the pid was reused after the holder died.
		ours := holder.PID == os.Getpid()
		if holder.Host != host || (!ours && processAlive(holder.PID)) || (ours && heldHere(lp)) {
			return nil, &LockedError{Path: lp, Holder: holder}
		}
		// Stale. Move it aside under a name of our own, and check that
		// what we moved is the stale lock we read (another process may
		// have taken it over in between); if not, put it back.
		aside := fmt.Sprintf("%s.stale-%d", lp, os.Getpid())
		if err := os.Rename(lp, aside); err != nil {
			continue
		}
		_, raw2, err := readLock(aside)
		if err != nil || string(raw2) != string(raw) {
			os.Link(aside, lp)
			os.Remove(aside)
			continue
		}
		os.Remove(aside)
		h := holder
		tookOver = &h
	}
	return nil, fmt.Errorf("%s: could not take the lock (contention)", lp)
}

// LockWait retries TryLock until it succeeds, ctx ends or wait elapses
// (wait <= 0: one try).
func (s *Store) LockWait(ctx context.Context, command string, wait time.Duration) (*Lock, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := s.TryLock(command)
		if err == nil || !errors.Is(err, ErrLocked) || wait <= 0 || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ReadLock returns the current lock holder, if any.
func (s *Store) ReadLock() (*LockInfo, error) {
	info, _, err := readLock(s.LockPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}

func readLock(p string) (LockInfo, []byte, error) {
	var info LockInfo
	f, err := os.Open(p)
	if err != nil {
		return info, nil, err
	}
	defer f.Close()
	raw := make([]byte, 4096)
	n, err := f.Read(raw)
	if err != nil && n == 0 {
		return info, nil, err
	}
	raw = raw[:n]
	if err := json.Unmarshal(raw, &info); err != nil {
		return info, raw, err
	}
	return info, raw, nil
}

// Unlock releases the lock if it is still ours.
func (l *Lock) Unlock() error {
	info, _, err := readLock(l.path)
	if err != nil {
		return err
	}
	if info.PID != l.info.PID || info.Host != l.info.Host || !info.Started.Equal(l.info.Started) {
		return fmt.Errorf("%s: lock is no longer ours", l.path)
	}
	held.Delete(l.path)
	return os.Remove(l.path)
}

// held records the lock paths this process holds.
var held sync.Map

func heldHere(p string) bool { _, ok := held.Load(p); return ok }
