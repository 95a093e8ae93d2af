package main

import (
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/internal/progress"
)

// The flags every command shares are made here, so that each means the
// same everywhere: --jobs defaults to all cores and must be positive,
// --json prints the command's result through the one JSON emitter.

// jobsFlag is -j/--jobs: workers, default all cores. usage says what they do.
func jobsFlag(usage string) cli.Flag {
	return &cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: runtime.NumCPU(), Usage: usage}
}

// jobsOf is the --jobs value, refused below 1.
func jobsOf(c *cli.Context) (int, error) {
	n := c.Int("jobs")
	if n < 1 {
		return 0, usageErrorf("%s: --jobs must be at least 1", commandPath(c))
	}
	return n, nil
}

// commandPath is the command c runs as the user typed it after "ferry",
// a subcommand with its parents: "mlx quantize", "store verify", "merge".
// Messages and lock files name commands by it. (urfave/cli v2's
// Command.FullName is the last name alone, "quantize", which is another
// command.)
func commandPath(c *cli.Context) string {
	var names []string
	for _, x := range c.Lineage() {
		if x.Command != nil && x.Command.Name != "" && x.Command.Name != c.App.Name {
			names = append(names, x.Command.Name)
		}
	}
	slices.Reverse(names)
	return strings.Join(names, " ")
}

// jsonFlag is --json; usage says what is printed.
func jsonFlag(usage string) cli.Flag {
	return &cli.BoolFlag{Name: "json", Usage: usage}
}

// dryRunFlag is --dry-run: plan, print, write nothing; usage says what is
// printed.
func dryRunFlag(usage string) cli.Flag {
	return &cli.BoolFlag{Name: "dry-run", Usage: usage}
}

// noSyncFlag is the one switch, on the commands that write a GGUF, that
// skips fsync (gguf.Options.NoSync).
func noSyncFlag() cli.Flag {
	return &cli.BoolFlag{Name: "no-sync", Usage: "do not fsync the output: as fast as cp, and as cp a power loss or system crash soon after can lose or damage it (a kill or Ctrl-C still resumes; after a reboot the run starts over)"}
}

// noSyncNote is what a command's result line adds when --no-sync was on.
func noSyncNote(noSync bool) string {
	if noSync {
		return " (not fsynced: --no-sync)"
	}
	return ""
}

// followLinksFlag is the one switch of ferry's symlink policy on every
// command that reads a model directory (internal/fsutil): without it a file
// that is a symlink resolving outside the directory is bad input.
func followLinksFlag() cli.Flag {
	return &cli.BoolFlag{Name: "follow-links", Usage: "read files that are symlinks resolving outside the model directory (refused by default; links into a Hugging Face cache or a ferry store are always fine)"}
}

// printJSON prints v, the command's result, on stdout.
func printJSON(c *cli.Context, v any) error { return jsonout.Write(stdout(c), v) }

func stdout(c *cli.Context) io.Writer {
	if c.App.Writer != nil {
		return c.App.Writer
	}
	return os.Stdout
}

func stderr(c *cli.Context) io.Writer {
	if c.App.ErrWriter != nil {
		return c.App.ErrWriter
	}
	return os.Stderr
}

// newProgress starts the progress of a long command on stderr: bars on a
// terminal, a plain line per task every FERRY_PROGRESS_INTERVAL (default
// 10s) otherwise. summary keeps a last line per task however short
// (pipeline stages).
func newProgress(c *cli.Context, summary bool) *progress.Group {
	return progress.NewGroup(stderr(c), progressOptions(summary))
}

// progressOptions are the progress options of the environment.
func progressOptions(summary bool) progress.Options {
	opts := progress.Options{Summary: summary}
	if v := os.Getenv(progress.IntervalEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			slog.Warn("ignoring "+progress.IntervalEnv, "value", v)
		} else {
			opts.Interval = d
		}
	}
	return opts
}
