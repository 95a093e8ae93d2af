package main

import (
	"log/slog"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/lockfile"
)

// lockWaitFlag is --lock-wait for a command that takes the lock of what
// ("the output", "the store", …).
func lockWaitFlag(what string) cli.Flag {
	return &cli.DurationFlag{
		Name:        "lock-wait",
		Usage:       "if another ferry process holds " + what + "'s lock, wait up to `DURATION` for it (a Go duration such as 30s, 5m or 1h30m; 0 fails at once)",
		DefaultText: "0",
	}
}

// claimOutput is where a command's write lifecycle starts, before it
// touches anything. It refuses an output that is one of the inputs, lies
// inside one, or (isDir: a directory output) holds one — fsutil.CheckApart,
// exit 2, nothing created. Then it takes the output's exclusive lock,
// OUT.lock beside the output (never inside it), waiting up to --lock-wait
// for another ferry holding it; if it is still held the command fails
// (exit 1, as for a locked store) with a message naming the holder's pid
// and host, having touched nothing. A lock left by a killed process of this
// host is taken over.
//
// release removes the lock; defer it. main cancels the context on Ctrl-C
// and SIGTERM, so the deferred call runs on success, failure and interrupt
// alike.
func claimOutput(c *cli.Context, out string, isDir bool, inputs ...string) (release func(), err error) {
	if err := fsutil.CheckApart(out, isDir, inputs...); err != nil {
		return nil, err
	}
	// Two spellings of one output (a link, a relative path) share a lock.
	lp := fsutil.ResolveExisting(out) + ".lock"
	dir := filepath.Dir(lp)
	if isDir {
		// A directory output is created with its parents; its lock needs
		// the parent first.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	} else if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, usageErrorf("%s: directory %s does not exist", out, filepath.Dir(out))
	}
	wait := c.Duration("lock-wait")
	if wait > 0 {
		if h, _ := lockfile.Read(lp); h != nil {
			slog.Info("waiting for the output lock", "lock", lp, "pid", h.PID, "host", h.Host, "for", wait)
		}
	}
	l, err := lockfile.Wait(c.Context, lp, "output", c.App.Name+" "+commandPath(c), wait)
	if err != nil {
		return nil, err
	}
	if l.TookOver != nil {
		slog.Warn("took over a stale output lock", "lock", lp, "pid", l.TookOver.PID, "host", l.TookOver.Host, "since", l.TookOver.Started)
	}
	return func() {
		if err := l.Unlock(); err != nil {
			slog.Warn("releasing the output lock", "err", err)
		}
	}, nil
}
