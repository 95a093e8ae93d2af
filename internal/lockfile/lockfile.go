// Package lockfile is ferry's one exclusive-lock mechanism: a small JSON
// file naming the holder's pid, host, start time and command, created
// atomically next to what it guards. The store lock (<store>/lock) and the
// output locks of the commands (OUT.lock beside the output) are both this.
//
// A lock whose holder is on this host and no longer alive (killed, even by
// SIGKILL) is stale and taken over; a lock from another host never is,
// since its holder's liveness cannot be known from here.
package lockfile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Info is the content of a lock file.
type Info struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	Command string    `json:"command,omitempty"`
}

// ErrLocked reports a lock held by another live process.
var ErrLocked = errors.New("locked")

// LockedError says what is locked and who holds it.
type LockedError struct {
	Path   string // the lock file
	What   string // what the lock guards, e.g. "store" or "output"
	Holder Info
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("%s: %s is %v by %s; wait for it to finish, or if that process is gone from another host, remove the lock file",
		e.Path, e.What, ErrLocked, e.Holder)
}

// String names the holder for messages: "pid 4242 on host studio-a since
// 2026-01-02T03:04:05Z (ferry mlx quantize)", the command as the holder
// recorded it (left out when the lock file has none).
func (i Info) String() string {
	s := fmt.Sprintf("pid %d on host %s since %s", i.PID, i.Host, i.Started.Format(time.RFC3339))
	if i.Command != "" {
		s += " (" + i.Command + ")"
	}
	return s
}

// Stale reports whether the lock's holder is a process of this host that
// is gone (killed): the next TryLock takes the lock over.
func (i Info) Stale() bool {
	host, _ := hostname()
	return i.Host == host && i.PID != os.Getpid() && !processAlive(i.PID)
}

func (e *LockedError) Unwrap() error { return ErrLocked }

// Lock is a held lock.
type Lock struct {
	path string
	info Info
	// TookOver is the stale lock this one replaced, if any.
	TookOver *Info
}

// Path is the lock file.
func (l *Lock) Path() string { return l.path }

// hostname is a variable so tests can pretend to be another host.
var hostname = os.Hostname

// TryLock takes the lock at path or returns a *LockedError naming the
// holder; what says what the lock guards (for the message), command what
// the taker is doing. The lock's directory must exist.
func TryLock(path, what, command string) (*Lock, error) {
	host, _ := hostname()
	info := Info{PID: os.Getpid(), Host: host, Started: time.Now().UTC(), Command: command}
	b, _ := json.Marshal(info)
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	var tookOver *Info
	sweep(dir, base)
	for attempt := 0; attempt < 5; attempt++ {
		// Write the content under a temp name, then link it to the lock
		// name: the lock appears complete or not at all.
		tmp, err := os.CreateTemp(dir, "."+base+"-*")
		if err != nil {
			return nil, fmt.Errorf("%s: creating the lock: %w", path, unwrapPath(err))
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
		err = os.Link(tmp.Name(), path)
		os.Remove(tmp.Name())
		if err == nil {
			held.Store(path, true)
			return &Lock{path: path, info: info, TookOver: tookOver}, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		holder, raw, rerr := read(path)
		if errors.Is(rerr, fs.ErrNotExist) {
			continue // released meanwhile
		}
		if rerr != nil {
			return nil, fmt.Errorf("%s: unreadable lock file: %w", path, rerr)
		}
		// Our own pid holds it only if this process took it (heldHere);
		// otherwise the pid was reused after the holder died.
		ours := holder.PID == os.Getpid()
		if holder.Host != host || (!ours && processAlive(holder.PID)) || (ours && heldHere(path)) {
			return nil, &LockedError{Path: path, What: what, Holder: holder}
		}
		// Stale. Move it aside under a name of our own, and check that
		// what we moved is the stale lock we read (another process may
		// have taken it over in between); if not, put it back.
		aside := fmt.Sprintf("%s.stale-%d", path, os.Getpid())
		if err := os.Rename(path, aside); err != nil {
			continue
		}
		_, raw2, err := read(aside)
		if err != nil || string(raw2) != string(raw) {
			os.Link(aside, path)
			os.Remove(aside)
			continue
		}
		os.Remove(aside)
		h := holder
		tookOver = &h
	}
	return nil, fmt.Errorf("%s: could not take the lock (contention)", path)
}

// sweep removes the temp files of the lock dir/base that a taker killed
// while taking it left behind: between creating its temp and linking it
// to the lock name, or between the link and the temp's removal (a
// SIGKILL right after the lock appeared). Each holds the Info of a process
// of this host that is gone (Stale), or nothing at all for a minute (killed
// before it wrote its Info); a temp a live process is writing, or one of a
// live process, is left alone.
func sweep(dir, base string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + base + "-"
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		info, raw, err := read(p)
		switch {
		case err == nil && info.Stale():
		case len(raw) == 0 && emptyFor(p, time.Minute):
		default:
			continue
		}
		os.Remove(p)
	}
}

// emptyFor reports whether the file at p is empty and was last written
// more than d ago.
func emptyFor(p string, d time.Duration) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Size() == 0 && time.Since(fi.ModTime()) > d
}

// unwrapPath drops an *fs.PathError's path (a temp name the user never
// asked for), keeping its cause.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Wait retries TryLock until it succeeds, ctx ends or wait elapses
// (wait <= 0: one try). When ctx ends first, the error names the lock and
// its holder, and wraps ctx's error.
func Wait(ctx context.Context, path, what, command string, wait time.Duration) (*Lock, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := TryLock(path, what, command)
		if err == nil || !errors.Is(err, ErrLocked) || wait <= 0 || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			var le *LockedError
			errors.As(err, &le)
			return nil, fmt.Errorf("%s: stopped waiting for the %s lock, held by %s: %w", path, what, le.Holder, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Read returns the holder of the lock at path, or nil when it is free.
func Read(path string) (*Info, error) {
	info, _, err := read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &info, nil
}

func read(p string) (Info, []byte, error) {
	var info Info
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
	info, _, err := read(l.path)
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
