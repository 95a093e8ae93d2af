package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/pipeline"
)

// varFlag collects --var KEY=VALUE arguments as given: urfave's string
// slices split at commas, and a list variable's value is comma-separated.
type varFlag struct{ args []string }

func (v *varFlag) Set(s string) error { v.args = append(v.args, s); return nil }
func (v *varFlag) String() string     { return strings.Join(v.args, " ") }

func newVarFlag() cli.Flag {
	return &cli.GenericFlag{Name: "var", Value: &varFlag{},
		Usage: "set the pipeline file's variable `NAME=VALUE` (repeatable; a list variable takes comma-separated values)"}
}

func pipelineCommand() *cli.Command {
	sel := []cli.Flag{
		newVarFlag(),
		&cli.StringSliceFlag{Name: "force", Usage: "re-run stage `NAME` even if it is up to date (repeatable)"},
		&cli.StringFlag{Name: "only", Usage: "run only stage `NAME` (its inputs must be complete)"},
		&cli.StringFlag{Name: "from", Usage: "re-run stage `NAME` and every stage that depends on it"},
		&cli.BoolFlag{Name: "verify", Usage: "re-hash recorded outputs instead of trusting their size/mtime/inode stamps"},
		jsonFlag("print the result as JSON"),
		cacheFlag(),
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
					jobsFlag("workers of each stage"),
					&cli.IntFlag{Name: "stages", Usage: "stages run at once (within --memory)", DefaultText: "core count"},
					&cli.StringFlag{Name: "memory", Usage: "memory budget the stages running at once share (`SIZE` like 8GB or 16GiB); a stage estimated over it runs alone", DefaultText: "half of RAM"},
					lockWaitFlag("the store"),
					&cli.BoolFlag{Name: "events", Usage: "print the run's events on stdout, one JSON object a line (stage start, skip, progress, done, failed, interrupted, warnings; the report last), for scripts"},
					&cli.StringFlag{Name: "ssh-config", Usage: "transfer stages read only this ssh_config (\"none\": no config), over the pipeline file's ssh_config"},
					&cli.StringFlag{Name: "known-hosts", Usage: "the known_hosts file transfer stages check, over the pipeline file's known_hosts"},
					&cli.StringSliceFlag{Name: "identity", Aliases: []string{"i"}, Usage: "identity file (private key) transfer stages try before the config's (repeatable), over the pipeline file's identity"},
					&cli.DurationFlag{Name: "lease-ttl", Usage: "on a shared store (store: s3://…): how long a stage's lease holds without renewal (renewed every third of it; a machine that dies is taken over after it), over the file's lease_ttl", DefaultText: pipeline.DefaultLeaseTTL.String()},
					&cli.StringFlag{Name: "cache-max", Usage: "on a shared store: keep the cache under `SIZE` (like 200GB) after a run by dropping results no stage points at any more, which the bucket holds (fetched again when wanted); over the file's cache_max", DefaultText: "no bound"},
					&cli.StringFlag{Name: "machine", EnvVars: []string{"FERRY_MACHINE"}, Usage: "this machine's `NAME` in the records it makes and a shared store's leases (\"being made on NAME\")", DefaultText: "the host name"},
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
				Flags:     []cli.Flag{newVarFlag(), jsonFlag("print the result as JSON"), cacheFlag()},
				Action:    pipelineStatus,
			},
		},
	}
}

func loadSpec(c *cli.Context) (*pipeline.Spec, error) {
	if c.NArg() != 1 {
		return nil, usageErrorf("%s: want one pipeline file, got %d arguments %q", commandPath(c), c.NArg(), c.Args().Slice())
	}
	vars := map[string]string{}
	if v, ok := c.Generic("var").(*varFlag); ok {
		for _, a := range v.args {
			k, val, err := pipeline.ParseVarFlag(a)
			if err != nil {
				return nil, err
			}
			if _, dup := vars[k]; dup {
				return nil, usageErrorf("--var %s given twice", k)
			}
			vars[k] = val
		}
	}
	spec, err := pipeline.Load(c.Args().First(), pipeline.WithKinds(stageKinds()), pipeline.WithVars(vars))
	if err != nil {
		return nil, err
	}
	if d := c.String("cache"); d != "" {
		if err := spec.UseCache(d); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// cacheFlag is --cache, the local cache of a pipeline on a shared store.
func cacheFlag() cli.Flag {
	return &cli.StringFlag{Name: "cache", Usage: "on a shared store (store: s3://…): this machine's local store `DIR` (views, work dirs, resume journals, the blobs made or fetched here)",
		DefaultText: "a directory per store under the user cache directory"}
}

// pipelineSpec is the pipeline file that run and plan load, and the
// options their flags give.
func pipelineSpec(c *cli.Context) (*pipeline.Spec, pipeline.Options, error) {
	spec, err := loadSpec(c)
	if err != nil {
		return nil, pipeline.Options{}, err
	}
	opts, err := pipelineOptions(c)
	return spec, opts, err
}

func pipelineOptions(c *cli.Context) (pipeline.Options, error) {
	o := pipeline.Options{
		Force:    c.StringSlice("force"),
		Only:     c.String("only"),
		From:     c.String("from"),
		Verify:   c.Bool("verify"),
		Version:  releaseVersion,
		Workers:  c.Int("jobs"),
		Stages:   c.Int("stages"),
		LockWait: c.Duration("lock-wait"),
		LeaseTTL: c.Duration("lease-ttl"),
		Host:     c.String("machine"),
		Log:      slog.Default(),
		SSH:      pipeline.SSHSettings{Config: c.String("ssh-config"), KnownHosts: c.String("known-hosts"), Identity: c.StringSlice("identity")},
	}
	if c.IsSet("lease-ttl") && o.LeaseTTL < 100*time.Millisecond {
		return o, usageErrorf("--lease-ttl %v: want a duration of at least 100ms, like 2m or 30s (3s at least on S3)", o.LeaseTTL)
	}
	if m := c.String("cache-max"); m != "" {
		n, ok := pipeline.ParseSize(m)
		if !ok || n == 0 {
			return o, usageErrorf("--cache-max %q: want a size like 200GB or 1TiB", m)
		}
		o.CacheMax = n
	}
	if m := c.String("memory"); m != "" {
		n, ok := pipeline.ParseSize(m)
		if !ok || n == 0 {
			return o, usageErrorf("--memory %q: want a size like 8GB or 16GiB", m)
		}
		o.Memory = n
	}
	return o, nil
}

func pipelineRun(c *cli.Context) error {
	spec, opts, err := pipelineSpec(c)
	if err != nil {
		return err
	}
	if opts.Workers, err = jobsOf(c); err != nil {
		return err
	}
	var events *eventStream
	var pg *progress.Group
	switch {
	case c.Bool("events") && c.Bool("json"):
		return usageErrorf("--events and --json: choose one (--events ends with the report)")
	case c.Bool("events"):
		events = &eventStream{w: stdout(c)}
		popts := progressOptions(true)
		if popts.Interval == 0 {
			popts.Interval = 2 * time.Second // scripts want more than the log's one line in 10 s
		}
		popts.Line = events.progressLine
		pg = progress.NewGroup(stderr(c), popts)
		opts.Events = events.event
		opts.Progress, opts.ShareProgress = plainBars(pg)
	default:
		pg = newProgress(c, true)
		opts.Progress, opts.ShareProgress = plainBars(pg)
		if pg.Terminal() {
			d := &display{pg: pg, name: spec.Name}
			opts.Events, opts.Progress, opts.ShareProgress = d.event, d.bar, d.shareBar
		}
	}
	opts.Log = slog.Default() // through the progress bars on a terminal
	rep, err := pipeline.Run(c.Context, spec, opts)
	pg.Close()
	// Interrupted (Ctrl-C, SIGTERM): the run says which stages it stopped
	// and what they left; errorMessage words any other interruption (a
	// lock wait cut short).
	var ie *pipeline.InterruptedError
	if errors.As(err, &ie) {
		if ierr := interruptedResume(c.Context, err, "%s", ie.Left()); ierr != nil {
			err = ierr
		}
	}
	if events != nil {
		events.end(c.Context, rep, err)
		if err == nil {
			err = events.err
		}
		return err
	}
	if rep != nil {
		if perr := printReport(c, rep, true); perr != nil && err == nil {
			err = perr
		}
	}
	return err
}

func pipelinePlan(c *cli.Context) error {
	spec, opts, err := pipelineSpec(c)
	if err != nil {
		return err
	}
	rep, err := pipeline.Plan(spec, opts)
	if rep != nil { // a stage its planner refused is in the report, and in err
		if perr := printReport(c, rep, false); perr != nil && err == nil {
			err = perr
		}
	}
	return err
}

func printReport(c *cli.Context, rep *pipeline.Report, ran bool) error {
	w := c.App.Writer
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	if rep.Cache != "" {
		fmt.Fprintf(w, "pipeline %s (store %s, cache %s)\n", rep.Pipeline, rep.Store, rep.Cache)
	} else {
		fmt.Fprintf(w, "pipeline %s (store %s)\n", rep.Pipeline, rep.Store)
	}
	printVars(w, rep.Vars)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, s := range rep.Stages {
		why := s.Reason
		if s.Error != "" {
			why += ": " + s.Error
		}
		if s.Plan != "" {
			why += "; " + s.Plan
		}
		if s.Action == pipeline.ActionInterrupted {
			why += "; " + pipeline.ResumableDetail(s.Resumable)
		}
		if s.NotShared != "" {
			why += "; NOT SHARED to " + rep.Store + " (the next run shares it): " + s.NotShared
		}
		secs := ""
		if ran && (s.Action == pipeline.ActionRun || s.Action == pipeline.ActionInterrupted) {
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
	// Offline, this machine's status still prints; the error after it
	// says the bucket's part is missing (and sets the exit code).
	sharedErr := pipeline.SharedStatus(c.Context, spec, rep)
	if sharedErr != nil {
		rep.SharedError = sharedErr.Error()
		sharedErr = fmt.Errorf("the shared store could not be read (this machine's status is above): %w", sharedErr)
	}
	w := c.App.Writer
	if c.Bool("json") {
		if err := printJSON(c, rep); err != nil {
			return err
		}
		return sharedErr
	}
	if rep.Shared != "" {
		fmt.Fprintf(w, "pipeline %s (store %s, cache %s)\n", rep.Pipeline, rep.Shared, rep.Store)
	} else {
		fmt.Fprintf(w, "pipeline %s (store %s)\n", rep.Pipeline, rep.Store)
	}
	printVars(w, rep.Vars)
	switch {
	case rep.LockStale:
		fmt.Fprintf(w, "store lock left by %s, a process that is gone (killed): the next run takes it over\n", rep.Lock)
	case rep.Lock != nil:
		fmt.Fprintf(w, "store locked by %s\n", rep.Lock) // pid, host, since, and the holder's command
	}
	for _, s := range rep.Stages {
		line := fmt.Sprintf("%s (%s): %s", s.Stage, s.Kind, s.State)
		if s.Finished != nil {
			line += ", finished " + s.Finished.Format("2006-01-02 15:04:05Z07:00")
			if s.Seconds > 0 {
				line += fmt.Sprintf(" (took %s)", formatSeconds(s.Seconds))
			}
			line += fmt.Sprintf(", %s, %s", plural(len(s.Outputs), "output"), pipeline.FormatBytes(s.Bytes))
		}
		switch {
		case s.State == pipeline.StatePartial || s.State == pipeline.StateInterrupted: // partial (266 MB resumable)
			line += " (" + s.Detail + ")"
		case s.Detail != "":
			line += "; " + s.Detail
		}
		fmt.Fprintln(w, line)
		if sh := s.Shared; sh != nil {
			switch {
			case sh.Problem != "":
				fmt.Fprintf(w, "    in %s: BROKEN REF: %s\n", rep.Shared, sh.Problem)
			case sh.Making != "":
				fmt.Fprintf(w, "    in %s: being made on %s (lease until %s)\n", rep.Shared, sh.Making, sh.Until.Local().Format("15:04:05"))
			case sh.Same:
				fmt.Fprintf(w, "    in %s: this record, made on %s\n", rep.Shared, sh.Host)
			case s.Key == "":
				fmt.Fprintf(w, "    in %s: record %s, made on %s (a run here fetches it if its inputs match)\n", rep.Shared, sh.Key[:min(12, len(sh.Key))], sh.Host)
			default:
				fmt.Fprintf(w, "    in %s: another record (%s), made on %s\n", rep.Shared, sh.Key[:min(12, len(sh.Key))], sh.Host)
			}
		} else if rep.Shared != "" && s.State == pipeline.StateComplete && s.Kind != "import" {
			fmt.Fprintf(w, "    not in %s (a run shares it)\n", rep.Shared)
		}
		if len(s.Outputs) > 0 {
			fmt.Fprintf(w, "    view %s\n", s.View)
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, o := range s.Outputs {
			fmt.Fprintf(tw, "    %s\t%s\t%d\t%s\n", o.Path, pipeline.FormatBytes(o.Size), o.Size, o.Digest)
		}
		tw.Flush()
		for _, r := range s.Remote {
			how := "read back"
			if r.HashCommand != "" {
				how = r.HashCommand
			}
			fmt.Fprintf(w, "    at %s: %d of %d files verified (%s), %s\n", r.Destination, r.Verified, len(r.Files), how, pipeline.FormatBytes(r.Bytes))
		}
	}
	return sharedErr
}

// printVars prints the file's variables, one line, each with where its
// value came from: "vars: BASE=/m (--var), HOSTS=a,b (default)".
func printVars(w io.Writer, vars []pipeline.Var) {
	if len(vars) == 0 {
		return
	}
	parts := make([]string, len(vars))
	for i, v := range vars {
		parts[i] = fmt.Sprintf("%s=%s (%s)", v.Name, v.String(), v.Source)
		if v.Value == nil {
			parts[i] = v.Name + " (not set)"
		}
	}
	fmt.Fprintf(w, "vars: %s\n", strings.Join(parts, ", "))
}

// formatSeconds prints a duration for people: 0.42s, 12.3s, 4m05s, 1h02m.
func formatSeconds(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", sec)
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", sec)
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}

// plural writes "1 output", "3 outputs".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
