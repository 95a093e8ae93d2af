package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

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
					lockWaitFlag("the store"),
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
		return nil, usageErrorf("%s: want one pipeline file, got %d arguments %q", c.Command.FullName(), c.NArg(), c.Args().Slice())
	}
	pipeline.FerryVersion = releaseVersion
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

func pipelineRun(c *cli.Context) error {
	spec, err := loadSpec(c)
	if err != nil {
		return err
	}
	opts := pipelineOptions(c)
	progress, done := newProgressFactory(os.Stderr)
	opts.Progress = progress
	opts.Log = slog.Default()
	rep, err := pipeline.Run(c.Context, spec, opts)
	done()
	if err != nil && c.Context.Err() != nil {
		err = fmt.Errorf("interrupted (%w): finished stages are recorded and unfinished ones resume where they stopped; run the same command again", err)
	}
	if rep != nil {
		if perr := printReport(c, rep, true); perr != nil && err == nil {
			err = perr
		}
	}
	return err
}

func pipelinePlan(c *cli.Context) error {
	spec, err := loadSpec(c)
	if err != nil {
		return err
	}
	rep, err := pipeline.Plan(spec, pipelineOptions(c))
	if err != nil {
		return err
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
func newProgressFactory(out *os.File) (func(string) pipeline.Progress, func()) {
	if !term.IsTerminal(int(out.Fd())) {
		return func(stage string) pipeline.Progress { return &logProgress{stage: stage} }, func() {}
	}
	tb := newTermBars(out)
	// Log lines go through the bars so they print above them.
	level := slog.LevelInfo
	if slog.Default().Enabled(context.Background(), slog.LevelDebug) {
		level = slog.LevelDebug
	}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(tb, &slog.HandlerOptions{Level: level})))
	return tb.newBar, func() { tb.close(); slog.SetDefault(prev) }
}

// termBars draws the bars of all running stages, one line each, below the
// log lines: every redraw moves the cursor up over the bars drawn last
// time, clears them and draws the current ones.
type termBars struct {
	mu    sync.Mutex
	out   io.Writer
	bars  []*barProgress
	drawn int
	stop  chan struct{}
	done  chan struct{}
}

func newTermBars(out io.Writer) *termBars {
	t := &termBars{out: out, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
				t.mu.Lock()
				t.clearLocked()
				t.drawLocked()
				t.mu.Unlock()
			}
		}
	}()
	return t
}

func (t *termBars) newBar(stage string) pipeline.Progress {
	b := &barProgress{tb: t}
	b.bar = progressbar.NewOptions64(-1,
		progressbar.OptionSetWriter(&b.line),
		progressbar.OptionSetDescription(stage),
		progressbar.OptionShowBytes(true),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
	)
	t.mu.Lock()
	t.bars = append(t.bars, b)
	t.mu.Unlock()
	return b
}

// Write prints p (log lines) above the bars.
func (t *termBars) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.clearLocked()
	n, err := t.out.Write(p)
	t.drawLocked()
	return n, err
}

func (t *termBars) clearLocked() {
	for ; t.drawn > 0; t.drawn-- {
		io.WriteString(t.out, "\x1b[1A\r\x1b[2K")
	}
}

func (t *termBars) drawLocked() {
	for _, b := range t.bars {
		if l := b.line.String(); l != "" {
			io.WriteString(t.out, l+"\n")
			t.drawn++
		}
	}
}

func (t *termBars) remove(b *barProgress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.clearLocked()
	for i, x := range t.bars {
		if x == b {
			t.bars = append(t.bars[:i], t.bars[i+1:]...)
			break
		}
	}
	t.drawLocked()
}

func (t *termBars) close() {
	close(t.stop)
	<-t.done
	t.mu.Lock()
	t.clearLocked()
	t.mu.Unlock()
}

type barProgress struct {
	tb   *termBars
	bar  *progressbar.ProgressBar
	line lineCapture
}

func (b *barProgress) SetTotal(n int64) { b.bar.ChangeMax64(n) }
func (b *barProgress) Add(n int64)      { b.bar.Add64(n) }
func (b *barProgress) Close() error     { b.tb.remove(b); return nil }

// lineCapture keeps the last line a progress bar rendered: a one-line
// terminal where "\r" starts the line over.
type lineCapture struct {
	mu   sync.Mutex
	line []byte
}

func (l *lineCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range p {
		switch c {
		case '\r', '\n':
			l.line = l.line[:0]
		default:
			l.line = append(l.line, c)
		}
	}
	return len(p), nil
}

func (l *lineCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.TrimRight(string(l.line), " ")
}

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
