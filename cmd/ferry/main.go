// Command ferry carries a fine-tuned LLM from the box where it was trained
// to the machines that serve it: merge, convert, quantize, verify, transfer.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferry-llm/ferry/internal/jsonout"
	"github.com/ferry-llm/ferry/pipeline"
	"github.com/urfave/cli/v2"
)

// releaseVersion is ferry's release. Records say which release made them;
// it is in no stage key (each stage kind's own format version is), so
// every release that makes the same bytes shares them.
const releaseVersion = "0.1.0"

// version is the build, stamped by the Makefile (-ldflags "-X main.version=…");
// it is shown by --version and never enters a stage key.
var version = "dev"

func newApp() *cli.App {
	return withUsageErrors(&cli.App{
		Name:    "ferry",
		Usage:   "carry a fine-tuned LLM from training box to serving machines",
		Version: releaseVersion + " (build " + version + ")",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "verbose", Usage: "debug logging on stderr"},
		},
		Before: func(c *cli.Context) error {
			level := slog.LevelInfo
			if c.Bool("verbose") {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
			return nil
		},
		Commands: []*cli.Command{
			inspectCommand(),
			mergeCommand(),
			ggufCommand(),
			quantizeCommand(),
			mlxCommand(),
			verifyCommand(),
			pipelineCommand(),
			storeCommand(),
			netcheckCommand(),
			transferCommand(),
			versionCommand(),
		},
		// Usage errors from flag parsing exit 2, like every bad input.
		OnUsageError: func(c *cli.Context, err error, isSubcommand bool) error {
			return usageErrorf("%v", err)
		},
		CommandNotFound: func(c *cli.Context, name string) {
			fmt.Fprintf(os.Stderr, "ferry: unknown command %q; see 'ferry --help'\n", name)
			os.Exit(exitBadInput)
		},
		ExitErrHandler: func(*cli.Context, error) {}, // exit codes are main's job
	})
}

func main() { os.Exit(run()) }

// run runs the command line in os.Args and returns the exit code.
func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	app := newApp()
	out := &countingWriter{w: os.Stdout}
	app.Writer = out
	args := interspersed(app, os.Args)
	err := unknownCommand(app, args)
	if err == nil {
		err = interrupted(ctx, app.RunContext(ctx, args))
	}
	stop()
	code := exitCode(err)
	if err != nil {
		msg := errorMessage(ctx, err)
		fmt.Fprintf(os.Stderr, "ferry: %s\n", msg)
		switch {
		case out.n > 0:
			// The command printed its result, or its events' end.
		case argsCommand(app, args) == "pipeline run" && wantsFlag(args, "events"):
			// A script reading --events' stream gets its end whatever
			// happened: a run that never started (no such pipeline file,
			// a usage error) ends in one line too.
			jsonout.Line(os.Stdout, pipeline.Event{Time: time.Now().UTC(), Event: pipeline.EventEnd, Error: strings.TrimSpace(msg)})
		case wantsFlag(args, "json"):
			// A script reading --json's stdout gets JSON whatever
			// happened: the error, where the command failed before its
			// result (a bucket that is not there, a file that is not a
			// model).
			jsonout.Write(os.Stdout, jsonError{Error: msg, ExitCode: code})
		}
	}
	return code
}

// jsonError is what --json prints when a command fails before its result.
type jsonError struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// wantsFlag says whether the command line turns the boolean flag name
// on (--json, --events; before a "--" that ends the flags): as the flag
// parser takes it, the last of its occurrences decides.
func wantsFlag(args []string, name string) bool {
	on := false
	for _, a := range args[1:] {
		switch {
		case a == "--":
			return on
		case a == "--"+name || a == "-"+name:
			on = true
		case strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"="):
			v, err := strconv.ParseBool(a[strings.Index(a, "=")+1:])
			on = err == nil && v
		}
	}
	return on
}

// countingWriter counts what a command wrote to stdout.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
