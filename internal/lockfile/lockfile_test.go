package lockfile

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// deadPID returns the pid of a process that has exited (and been reaped).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("cannot start a child process: %v", err)
	}
	return cmd.Process.Pid
}

func writeLock(t *testing.T, p string, info Info) {
	t.Helper()
	b, _ := json.Marshal(info)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTryLock: what an existing lock file means for the next taker.
func TestTryLock(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		name     string
		existing func(t *testing.T, p string) // nil: no lock file
		wantErr  error                        // nil: the lock is taken
		tookOver bool
	}{
		{"free", nil, nil, false},
		{"held by a live process of this host", func(t *testing.T, p string) {
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			writeLock(t, p, Info{PID: cmd.Process.Pid, Host: host, Started: time.Now(), Command: "sleep"})
		}, ErrLocked, false},
		{"holder on this host is dead: stale", func(t *testing.T, p string) {
			writeLock(t, p, Info{PID: deadPID(t), Host: host, Started: time.Now().Add(-time.Hour)})
		}, nil, true},
		{"our pid, not taken by this process: reused after its holder died", func(t *testing.T, p string) {
			writeLock(t, p, Info{PID: os.Getpid(), Host: host, Started: time.Now().Add(-time.Hour)})
		}, nil, true},
		{"another host's lock is never taken over", func(t *testing.T, p string) {
			writeLock(t, p, Info{PID: deadPID(t), Host: host + "-elsewhere", Started: time.Now()})
		}, ErrLocked, false},
		{"unreadable lock", func(t *testing.T, p string) {
			os.WriteFile(p, []byte("{not json"), 0o644)
		}, errors.New("unreadable lock file"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "out.lock")
			if tt.existing != nil {
				tt.existing(t, p)
			}
			before, _ := os.ReadFile(p)
			l, err := TryLock(p, "output", "test")
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("TryLock: %v", err)
			case tt.wantErr == ErrLocked:
				var le *LockedError
				if !errors.As(err, &le) || !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "output is locked by pid") {
					t.Fatalf("TryLock: %v, want a *LockedError", err)
				}
			case tt.wantErr != nil:
				if err == nil || !strings.Contains(err.Error(), tt.wantErr.Error()) {
					t.Fatalf("TryLock: %v, want %v", err, tt.wantErr)
				}
			}
			if err != nil {
				if after, _ := os.ReadFile(p); string(after) != string(before) {
					t.Errorf("a refused TryLock changed the lock file: %q → %q", before, after)
				}
				return
			}
			if (l.TookOver != nil) != tt.tookOver {
				t.Errorf("TookOver %+v, want a takeover: %v", l.TookOver, tt.tookOver)
			}
			info, err := Read(p)
			if err != nil || info == nil || info.PID != os.Getpid() || info.Command != "test" {
				t.Fatalf("Read: %+v, %v", info, err)
			}
			// This process holds it now: a second TryLock is refused.
			if _, err := TryLock(p, "output", "again"); !errors.Is(err, ErrLocked) {
				t.Errorf("second TryLock in the holding process: %v", err)
			}
			if err := l.Unlock(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
				t.Error("Unlock left the lock file")
			}
			if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 0 {
				t.Errorf("left behind %v", ents)
			}
		})
	}
}

func TestWait(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lock")
	l, err := TryLock(p, "store", "holder")
	if err != nil {
		t.Fatal(err)
	}
	// No wait: refused at once.
	start := time.Now()
	if _, err := Wait(context.Background(), p, "store", "w", 0); !errors.Is(err, ErrLocked) || time.Since(start) > time.Second {
		t.Fatalf("Wait 0: %v after %v", err, time.Since(start))
	}
	// A wait shorter than the holder's run: refused once it elapses.
	if _, err := Wait(context.Background(), p, "store", "w", 300*time.Millisecond); !errors.Is(err, ErrLocked) {
		t.Fatalf("short wait: %v", err)
	}
	// The context ends the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = Wait(ctx, p, "store", "w", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), p+": stopped waiting for the store lock, held by pid ") || !strings.Contains(err.Error(), " (holder)") {
		t.Fatalf("cancelled wait: %v; want it to name the lock and its holder", err)
	}
	// Released meanwhile: the waiter gets it.
	go func() { time.Sleep(300 * time.Millisecond); l.Unlock() }()
	l2, err := Wait(context.Background(), p, "store", "waiter", 5*time.Second)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	if err := l2.Unlock(); err != nil {
		t.Fatal(err)
	}
}

// The refusal names the holder by what its lock file records: pid, host,
// start and the command as the holder typed it, left out when the file
// has none (a lock written before commands were recorded).
func TestLockedErrorNamesHolder(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tt := range []struct {
		holder Info
		want   string
	}{
		{Info{PID: 4242, Host: "studio-a", Started: started, Command: "ferry mlx quantize"},
			"out.lock: output is locked by pid 4242 on host studio-a since 2026-01-02T03:04:05Z (ferry mlx quantize); wait for it"},
		{Info{PID: 7, Host: "b", Started: started},
			"out.lock: output is locked by pid 7 on host b since 2026-01-02T03:04:05Z; wait for it"},
	} {
		err := &LockedError{Path: "out.lock", What: "output", Holder: tt.holder}
		if !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%+v: %q, want it to begin %q", tt.holder, err.Error(), tt.want)
		}
	}
}

func TestStale(t *testing.T) {
	host, _ := hostname()
	for _, tc := range []struct {
		name string
		info Info
		want bool
	}{
		{"a process of this host that is gone", Info{PID: deadPID(t), Host: host}, true},
		{"this process", Info{PID: os.Getpid(), Host: host}, false},
		{"a live process of this host", Info{PID: os.Getppid(), Host: host}, false},
		{"another host", Info{PID: deadPID(t), Host: host + "-other"}, false},
	} {
		if got := tc.info.Stale(); got != tc.want {
			t.Errorf("%s: Stale() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TryLock removes what a taker killed while taking the same lock left
// beside it (its temp file: its Info, or nothing for over a minute), and
// nothing else.
func TestTryLockSweepsKilledTakersTemps(t *testing.T) {
	host, _ := hostname()
	dir := t.TempDir()
	dead := Info{PID: deadPID(t), Host: host}
	for _, tc := range []struct {
		name    string
		info    *Info         // nil: the content below
		content string        // when info is nil
		age     time.Duration // how long ago it was written
		removed bool
	}{
		{".x.lock-1", &dead, "", 0, true},
		{".x.lock-2", &Info{PID: os.Getppid(), Host: host}, "", 0, false},
		{".x.lock-3", &Info{PID: os.Getpid(), Host: host}, "", 0, false},
		{".x.lock-4", &Info{PID: dead.PID, Host: host + "-other"}, "", 0, false},
		{".x.lock-5", nil, "", 2 * time.Minute, true},
		{".x.lock-6", nil, "", 0, false},
		{".x.lock-7", nil, "not a lock", 2 * time.Minute, false},
		{".y.lock-1", &dead, "", 0, false},
		{"x.lock-1", &dead, "", 0, false},
	} {
		p := filepath.Join(dir, tc.name)
		if tc.info != nil {
			writeLock(t, p, *tc.info)
		} else if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		if tc.age > 0 {
			old := time.Now().Add(-tc.age)
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			_, err := os.Stat(p)
			if gone := errors.Is(err, fs.ErrNotExist); gone != tc.removed {
				t.Errorf("%s: removed %v, want %v", tc.name, gone, tc.removed)
			}
		})
	}
	l, err := TryLock(filepath.Join(dir, "x.lock"), "output", "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
}
