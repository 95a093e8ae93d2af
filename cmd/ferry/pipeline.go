package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/ferry-llm/ferry/pipeline"
)

func pipelineCommand() *cli.Command {
	sel := []cli.Flag{
		&cli.StringSliceFlag{Name: "force", Usage: "re-run stage `NAME` even if it is up to date (repeatable)"},
		&cli.StringFlag{Name: "only", Usage: "run only stage `NAME` (its inputs must be complete)"},
		&cli.StringFlag{Name: "from", Usage: "re-run stage `NAME` and every stage that depends on it"},
		&cli.BoolFlag{Name: "verify", Usage: "re-hash recorded outputs instead of trusting their size/mtime/inode stamps"},
		&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"},
	}
	return &cli.Command{
		Name:  "pipeline",
		Usage: "run, plan and show a pipeline file",
		Subcommands: []*cli.Command{
			{
				Name:      "run",
				Usage:     "run the stages that are not up to date",
				ArgsUsage: "FILE.yaml",
				Flags: append(sel,
					&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Usage: "stages run at once, and each stage's workers", DefaultText: "core count"},
					&cli.DurationFlag{Name: "lock-wait", Usage: "wait this long for a store locked by another run", DefaultText: "fail at once"},
				),
				Action: pipelineRun,
			},
			{
				Name:      "plan",
				Usage:     "say per stage whether run would run it and why (reads no weight data)",
				ArgsUsage: "FILE.yaml",
				Flags:     sel,
				Action:    pipelinePlan,
			},
			{
				Name:      "status",
				Usage:     "show each stage's state, outputs, sizes and digests",
				ArgsUsage: "FILE.yaml",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print the result as JSON"}},
				Action:    pipelineStatus,
			},
		},
	}
}

func loadSpec(c *cli.Context) (*pipeline.Spec, error) {
	if c.NArg() != 1 {
		return nil, usageErrorf("%s: want one pipeline file, got %d arguments %q (flags go before the file)", c.Command.FullName(), c.NArg(), c.Args().Slice())
	}
	pipeline.FerryVersion = version
	return pipeline.Load(c.Args().First())
}

func pipelineOptions(c *cli.Context) pipeline.Options {
	return pipeline.Options{
		Force:    c.StringSlice("force"),
		Only:     c.String("only"),
		From:     c.String("from"),
		Verify:   c.Bool("verify"),
		Jobs:     c.Int("jobs"),
		LockWait: c.Duration("lock-wait"),
		Log:      slog.Default(),
	}
}

func usageOr(err error) error {
	if errors.Is(err, pipeline.ErrVerifyFailed) {
		return verifyFailed(err)
	}
	if errors.Is(err, pipeline.ErrUsage) {
		return usageErrorf("%s", strings.TrimPrefix(err.Error(), pipeline.ErrUsage.Error()+": "))
	}
	return err
}

func pipelineRun(c *cli.Context) error {
	spec, err := loadSpec(c)
	if err != nil {
		return err
	}
	opts := pipelineOptions(c)
	opts.Progress = newProgressFactory(os.Stderr)
	rep, err := pipeline.Run(c.Context, spec, opts)
	if rep != nil {
		if perr := printReport(c, rep, true); perr != nil && err == nil {
			err = perr
		}
	}
	return usageOr(err)
}

func pipelinePlan(c *cli.Context) error {
	spec, err := loadSpec(c)
	if err != nil {
		return err
	}
	rep, err := pipeline.Plan(spec, pipelineOptions(c))
	if err != nil {
		return usageOr(err)
	}
	return printReport(c, rep, false)
}

func printReport(c *cli.Context, rep *pipeline.Report, ran bool) error {
	w := c.App.Writer
	if c.Bool("json") {
		return pipelineJSON(w, rep)
	}
	fmt.Fprintf(w, "pipeline %s (store %s)\n", rep.Pipeline, rep.Store)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range rep.Stages {
		why := s.Reason
		if s.Error != "" {
			why += ": " + s.Error
		}
		secs := ""
		if ran && s.Action == pipeline.ActionRun {
			secs = fmt.Sprintf("%.2fs", s.Seconds)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", s.Stage, s.Kind, s.Action, secs, why)
	}
	return tw.Flush()
}

func pipelineStatus(c *cli.Context) error {
	spec, err := loadSpec(c)
	if err != nil {
		return err
	}
	rep, err := pipeline.Status(spec)
	if err != nil {
		return err
	}
	w := c.App.Writer
	if c.Bool("json") {
		return pipelineJSON(w, rep)
	}
	fmt.Fprintf(w, "pipeline %s (store %s)\n", rep.Pipeline, rep.Store)
	if rep.Lock != nil {
		fmt.Fprintf(w, "store locked by pid %d on %s since %s\n", rep.Lock.PID, rep.Lock.Host, rep.Lock.Started.Format("2006-01-02 15:04:05Z07:00"))
	}
	for _, s := range rep.Stages {
		line := fmt.Sprintf("%s (%s): %s", s.Stage, s.Kind, s.State)
		if s.Finished != nil {
			line += ", finished " + s.Finished.Format("2006-01-02 15:04:05Z07:00")
		}
		if s.Detail != "" {
			line += "; " + s.Detail
		}
		fmt.Fprintln(w, line)
		if len(s.Outputs) > 0 {
			fmt.Fprintf(w, "    view %s\n", s.View)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, o := range s.Outputs {
			fmt.Fprintf(tw, "    %s\t%d\t%s\n", o.Path, o.Size, o.Digest)
		}
		tw.Flush()
	}
	return nil
}

func pipelineJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newProgressFactory makes one progress bar per running stage on a TTY, and
// plain log lines (start, each quarter) otherwise.
func newProgressFactory(out *os.File) func(string) pipeline.Progress {
	tty := term.IsTerminal(int(out.Fd()))
	return func(stage string) pipeline.Progress {
		if tty {
			return &barProgress{bar: progressbar.NewOptions64(-1,
				progressbar.OptionSetWriter(out),
				progressbar.OptionSetDescription(stage),
				progressbar.OptionShowBytes(true),
				progressbar.OptionShowTotalBytes(true),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100e6),
				progressbar.OptionClearOnFinish(),
			)}
		}
		return &logProgress{stage: stage}
	}
}

type barProgress struct{ bar *progressbar.ProgressBar }

func (b *barProgress) SetTotal(n int64) { b.bar.ChangeMax64(n) }
func (b *barProgress) Add(n int64)      { b.bar.Add64(n) }
func (b *barProgress) Close() error     { b.bar.Finish(); return nil }

type logProgress struct {
	mu      sync.Mutex
	stage   string
	total   int64
	done    int64
	quarter int64
}

func (l *logProgress) SetTotal(n int64) {
	l.mu.Lock()
	l.total = n
	l.mu.Unlock()
}

func (l *logProgress) Add(n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done += n
	if l.total <= 0 {
		return
	}
	if q := l.done * 4 / l.total; q > l.quarter && q < 4 {
		l.quarter = q
		slog.Info("progress", "stage", l.stage, "bytes", l.done, "of", l.total, "pct", q*25)
	}
}
