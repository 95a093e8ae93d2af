package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/mlxpack"
)

func mlxCommand() *cli.Command {
	return &cli.Command{
		Name:  "mlx",
		Usage: "MLX repack (compressed-tensors, no requantizing) and quantization",
		Subcommands: []*cli.Command{
			mlxRepackCommand(),
			mlxQuantizeCommand(),
		},
	}
}

func mlxRepackCommand() *cli.Command {
	return &cli.Command{
		Name:      "repack",
		Usage:     "compressed-tensors pack-quantized checkpoint → MLX directory, no weight bytes changed",
		ArgsUsage: mlxArgsUsage,
		UsageText: "ferry mlx repack SRC --out DIR [--relative] [--rewrite] [-j N] [--force] [--lock-wait DURATION] [--json]\n" +
			mlxOlderForm,
		Description: "Writes DST as a farm of symlinks to SRC's files plus a config.json with the MLX\n" +
			"quantization block derived from SRC's quantization_config. mlx-lm reads the packed\n" +
			"weights directly for deepseek_v3, kimi_k2, kimi_k25 and joyai_llm_flash; for other\n" +
			"model types --rewrite writes MLX-named shards for the packed tensors (weight as the\n" +
			"uint32 view, scales, biases = -2^(bits-1)*scales) and links the rest; for qwen3_moe\n" +
			"and qwen3_5_moe it writes per-expert packed modules stacked into switch_mlp\n" +
			"(weight, scales, biases [E, ...] in expert order), as mlx-lm stacks only .weight.",
		Flags: append(mlxPathFlags("destination `DIR` (created; an existing one must be empty or an earlier repack)"),
			&cli.BoolFlag{Name: "relative", Usage: "relative symlinks (relocatable trees)"},
			&cli.BoolFlag{Name: "rewrite", Usage: "write MLX-named shards for packed tensors (model types mlx-lm does not rename)"},
			&cli.BoolFlag{Name: "force", Usage: "accept a destination holding other files (left in place)"},
			jobsFlag("shards --rewrite writes at once"),
			followLinksFlag(),
			jsonFlag("print the result as JSON"),
			lockWaitFlag("the destination"),
		),
		Action:       mlxRepack,
		OnUsageError: mlxUsageError,
	}
}

func mlxRepack(c *cli.Context) error {
	src, dst, jobs, err := mlxArgs(c, false)
	if err != nil {
		return err
	}
	opts := mlxpack.Options{
		Rewrite:             c.Bool("rewrite"),
		Relative:            c.Bool("relative"),
		Force:               c.Bool("force"),
		Jobs:                jobs,
		FollowExternalLinks: c.Bool("follow-links"),
	}
	plan, err := mlxpack.PlanRepack(src, opts)
	if err != nil {
		return err
	}
	defer plan.Close()
	var res *mlxpack.Result
	err = mlxWrite(c, src, dst, "repacking", plan.RewriteBytes(), func(progress func(int64)) (err error) {
		plan.Opts.Progress = progress
		res, err = mlxpack.Repack(c.Context, plan, dst)
		return err
	})
	if err != nil {
		return err
	}
	out := c.App.Writer
	if c.Bool("json") {
		return printJSON(c, res)
	}
	counts := map[mlxpack.EntryKind]map[mlxpack.Action]int{}
	for _, e := range res.Entries {
		if counts[e.Kind] == nil {
			counts[e.Kind] = map[mlxpack.Action]int{}
		}
		counts[e.Kind][e.Action]++
	}
	fmt.Fprintf(out, "%s → %s\n", res.Src, res.Dst)
	fmt.Fprintf(out, "  mode %s, model_type %s, %d packed modules\n", res.Mode, res.ModelType, res.PackedModules)
	fmt.Fprintf(out, "  quantization %s\n", quantSummary(res.Quantization))
	kinds := make([]mlxpack.EntryKind, 0, len(counts))
	for k := range counts {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		var parts []string
		for _, a := range []mlxpack.Action{mlxpack.ActionCreated, mlxpack.ActionReplaced, mlxpack.ActionUnchanged} {
			if n := counts[k][a]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, a))
			}
		}
		fmt.Fprintf(out, "  %-6s %s\n", k, strings.Join(parts, ", "))
	}
	fmt.Fprintf(out, "  new bytes: %d\n", res.NewBytes)
	for _, f := range res.Foreign {
		fmt.Fprintf(out, "  left in place (--force): %s\n", f)
	}
	if !res.Changed {
		fmt.Fprintln(out, "  already up to date: nothing written")
	}
	return nil
}

// Both mlx subcommands name their source and output the same way: SRC as
// the argument or --src, the output as --out (-o, or --dst: the older
// form).
const (
	mlxArgsUsage = "SRC --out DIR"
	mlxOlderForm = "   (the older form --src SRC --dst DIR still works)"
)

// mlxPathFlags are --out (usage says what DIR is) and --src.
func mlxPathFlags(outUsage string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "out", Aliases: []string{"o", "dst"}, Usage: outUsage},
		&cli.StringFlag{Name: "src", Usage: "source checkpoint `DIR`, instead of the SRC argument"},
	}
}

// mlxArgs are SRC (the argument or --src, not both), the output
// directory (required unless outOptional: a dry run) and --jobs.
func mlxArgs(c *cli.Context, outOptional bool) (src, out string, jobs int, err error) {
	cmd := "mlx " + c.Command.Name
	flag := ""
	if c.IsSet("src") {
		flag = c.String("src")
	}
	switch {
	case c.NArg() > 1:
		return "", "", 0, usageErrorf("%s: want one SRC directory, got %q", cmd, c.Args().Slice())
	case c.NArg() == 1 && flag != "":
		return "", "", 0, usageErrorf("%s: give SRC as the argument or as --src, not both", cmd)
	case c.NArg() == 1:
		src = c.Args().First()
	case flag != "":
		src = flag
	default:
		return "", "", 0, usageErrorf("%s: SRC directory is required ('ferry %s SRC --out DIR')", cmd, cmd)
	}
	out = c.String("out")
	if out == "" && !outOptional {
		return "", "", 0, usageErrorf("%s: --out DIR is required", cmd)
	}
	jobs, err = jobsOf(c)
	return src, out, jobs, err
}

// mlxWrite runs write with the output claimed (claimOutput, --lock-wait)
// and a progress bar (label, total bytes) that write feeds.
func mlxWrite(c *cli.Context, src, out, label string, total int64, write func(progress func(int64)) error) error {
	release, err := claimOutput(c, out, true, src)
	if err != nil {
		return err
	}
	defer release()
	pg := newProgress(c, false)
	bar := pg.New(label, total, "task", "mlx "+c.Command.Name)
	err = write(bar.Add)
	bar.Close()
	pg.Close()
	return err
}

// mlxUsageError names the subcommand in a flag-parsing error (exit 2).
func mlxUsageError(c *cli.Context, err error, _ bool) error {
	return usageErrorf("mlx %s: %v", c.Command.Name, err)
}

func quantSummary(q map[string]any) string {
	s := fmt.Sprintf("bits %v, group_size %v, mode %v", q["bits"], q["group_size"], q["mode"])
	if n := len(q) - 3; n > 0 {
		s += fmt.Sprintf(", %d per-layer overrides", n)
	}
	return s
}
