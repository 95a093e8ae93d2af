// Command ferry carries a fine-tuned LLM from the box where it was trained
// to the machines that serve it: merge, convert, quantize, verify, transfer.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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
	err := interrupted(ctx, app.RunContext(ctx, interspersed(app, os.Args)))
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferry: %s\n", errorMessage(ctx, err))
	}
	return exitCode(err)
}
