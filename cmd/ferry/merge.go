package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/merge"
)

func mergeCommand() *cli.Command {
	return &cli.Command{
		Name:  "merge",
		Usage: "merge a PEFT LoRA / DoRA / rsLoRA adapter into a safetensors checkpoint, shard by shard",
		UsageText: "ferry merge --base DIR --adapter DIR --out DIR [--dtype bf16|f16|f32] [--jobs N] [--allow-unused] [--allow-nonfinite] [--json]\n" +
			"ferry merge --base DIR --adapter DIR --dry-run [--json]",
		Description: "Merges exactly as PEFT's merge_and_unload (float32 arithmetic, one rounding), streaming\n" +
			"row blocks so memory stays bounded, and copies every tensor the adapter does not touch\n" +
			"byte for byte (mtp.* included). Shards keep the base's names; shards without adapted\n" +
			"tensors are identical files. A killed merge, re-run, resumes.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "base", Usage: "base checkpoint directory (safetensors)"},
			&cli.StringFlag{Name: "adapter", Usage: "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)"},
			&cli.StringFlag{Name: "out", Usage: "output directory (created; an interrupted run's directory is resumed)"},
			&cli.StringFlag{Name: "dtype", Usage: "dtype of the merged tensors: bf16, f16 or f32 (default: the base tensor's)"},
			jobsFlag("row-block workers (output bytes do not depend on it)"),
			dryRunFlag("print the plan and write nothing"),
			&cli.BoolFlag{Name: "allow-unused", Usage: "merge even if some adapter tensors would be ignored"},
			&cli.BoolFlag{Name: "allow-nonfinite", Usage: "merge even where the adapter brings NaN or Inf (by default refused, as PEFT's safe_merge does)"},
			followLinksFlag(),
			jsonFlag("print the plan or result as JSON"),
			lockWaitFlag("the output"),
		},
		Action: runMerge,
	}
}

func runMerge(c *cli.Context) error {
	if c.NArg() > 0 {
		return usageErrorf("merge takes no arguments (got %q); use --base, --adapter and --out", c.Args().First())
	}
	for _, f := range []string{"base", "adapter"} {
		if c.String(f) == "" {
			return usageErrorf("--%s is required", f)
		}
	}
	dt, err := merge.ParseDType(c.String("dtype"))
	if err != nil {
		return usageErrorf("--dtype: %v", err)
	}
	jobs, err := jobsOf(c)
	if err != nil {
		return err
	}
	if !c.Bool("dry-run") && c.String("out") == "" {
		return usageErrorf("--out is required (or use --dry-run)")
	}
	plan, err := merge.Inventory(c.String("base"), c.String("adapter"), merge.PlanOptions{AllowUnused: c.Bool("allow-unused"), DType: dt, FollowLinks: c.Bool("follow-links")})
	if err != nil {
		return err
	}
	defer plan.Close()
	stdout := stdout(c)
	if c.Bool("dry-run") {
		if c.Bool("json") {
			return printJSON(c, plan)
		}
		printPlan(stdout, plan)
		return nil
	}
	release, err := claimOutput(c, c.String("out"), true, c.String("base"), c.String("adapter"))
	if err != nil {
		return err
	}
	defer release()

	// What the plan leaves out is said before the merge, not only by
	// --dry-run: with --allow-unused the ignored tensors are listed.
	errw := stderr(c)
	if len(plan.Unused) > 0 {
		fmt.Fprintf(errw, "merge: ignoring %d adapter tensors (--allow-unused): %s\n", len(plan.Unused), strings.Join(plan.Unused, ", "))
	}
	for i, w := range plan.Warnings {
		if i == 10 {
			fmt.Fprintf(errw, "merge: … %d more warnings (--dry-run lists them all)\n", len(plan.Warnings)-i)
			break
		}
		fmt.Fprintf(errw, "merge: warning: %s\n", w)
	}

	pg := newProgress(c, false)
	bar := pg.New("merging", plan.TotalBytes, "task", "merge")
	var last int64
	progress := func(done, _ int64) { bar.Add(done - last); last = done }
	start := time.Now()
	var nf nonFiniteCounts
	res, err := merge.Execute(c.Context, plan, c.String("out"), merge.ExecOptions{Jobs: jobs, Progress: progress,
		AllowNonFinite: c.Bool("allow-nonfinite"), NonFinite: nf.add})
	bar.Close()
	pg.Close()
	if err != nil {
		if ierr := interruptedResume(c.Context, err, "%s is not complete (no index yet); the shards finished so far are kept and verified on resume", c.String("out")); ierr != nil {
			return ierr
		}
		return err
	}
	elapsed := time.Since(start)
	nf.warn(errw, "merge", "in the base; merged as they are")
	if c.Bool("json") {
		return printJSON(c, struct {
			*merge.Result
			Modules   int              `json:"modules"`
			Unused    []string         `json:"unused,omitempty"`
			Warnings  []string         `json:"warnings,omitempty"`
			NonFinite []nonFiniteCount `json:"nonfinite,omitempty"`
			Seconds   float64          `json:"seconds"`
		}{res, len(plan.Modules), plan.Unused, plan.Warnings, nf.sorted(), elapsed.Seconds()})
	}
	fmt.Fprintf(stdout, "merged %d modules into %s: %d shards written, %d resumed, %d files in all (%.1f s, %.0f MB/s)\n",
		len(plan.Modules), res.OutDir, len(res.Written), len(res.Resumed), len(res.Files), elapsed.Seconds(),
		float64(plan.TotalBytes)/1e6/max(elapsed.Seconds(), 1e-9))
	for _, f := range res.Files {
		fmt.Fprintf(stdout, "  %s  %12d  %s\n", f.SHA256, f.Size, f.Name)
	}
	return nil
}

func printPlan(w io.Writer, p *merge.Plan) {
	kind := "LoRA"
	switch {
	case p.DoRA && p.RSLoRA:
		kind = "DoRA + rsLoRA"
	case p.DoRA:
		kind = "DoRA"
	case p.RSLoRA:
		kind = "rsLoRA"
	}
	fmt.Fprintf(w, "merge plan: %s adapter %s into %s\n", kind, p.AdapterDir, p.BaseDir)
	if p.KeyRewrite != "" {
		fmt.Fprintf(w, "key mapping: %s\n", p.KeyRewrite)
	}
	if p.DType != "" {
		fmt.Fprintf(w, "merged tensors written as %s\n", p.DType)
	}
	fmt.Fprintf(w, "%d targeted modules:\n", len(p.Modules))
	for _, m := range p.Modules {
		dora := ""
		if m.DoRA {
			dora = " DoRA"
		}
		extra := ""
		if m.FanInFanOut {
			extra += " fan_in_fan_out"
		}
		if m.LoraBias != "" {
			extra += " +lora_bias"
		}
		fmt.Fprintf(w, "  %-60s %-9s r=%-4d alpha=%-6g scaling=%-8.6g%s%s  [%d×%d]\n", m.Target, m.Kind, m.Rank, m.Alpha, m.Scaling, dora, extra, m.Rows, m.Cols)
	}
	var replaced []string
	for _, s := range p.Shards {
		for _, t := range s.Tensors {
			if t.Op == merge.OpReplace {
				replaced = append(replaced, t.Name)
			}
		}
	}
	if len(replaced) > 0 {
		fmt.Fprintf(w, "%d tensors replaced from the adapter (modules_to_save, trained biases): %s\n", len(replaced), strings.Join(replaced, ", "))
	}
	fmt.Fprintf(w, "shards: %d rewrite, %d keep (copied byte for byte)\n", p.RewriteCount(), len(p.Shards)-p.RewriteCount())
	for _, s := range p.Shards {
		what := "keep   "
		if s.Rewrite {
			what = "rewrite"
		}
		fmt.Fprintf(w, "  %s %s (%d tensors, %d bytes)\n", what, s.Name, len(s.Tensors), s.Size)
	}
	fmt.Fprintf(w, "also copied: %s\n", strings.Join(p.AuxFiles, ", "))
	for _, u := range p.Unused {
		fmt.Fprintf(w, "unused adapter tensor: %s\n", u)
	}
	for _, warn := range p.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warn)
	}
}
