package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/safetensors"
)

func ggufCommand() *cli.Command {
	return &cli.Command{
		Name:  "gguf",
		Usage: "GGUF conversion",
		Subcommands: []*cli.Command{
			ggufConvertCommand(),
		},
		Action: func(c *cli.Context) error {
			return usageErrorf("'ferry gguf' needs a subcommand: 'ferry gguf convert DIR --out FILE'")
		},
	}
}

func ggufConvertCommand() *cli.Command {
	return &cli.Command{
		Name:      "convert",
		Usage:     "convert a Hugging Face safetensors checkpoint to GGUF as convert_hf_to_gguf.py does",
		ArgsUsage: "DIR",
		Description: "Reads every shard header first and refuses unknown architectures, missing tensors, shape\n" +
			"mismatches and a config that promises an MTP head the shards lack, before writing a byte.\n" +
			"Then streams the tensors (a row block per worker) into FILE.partial and renames it to FILE.\n" +
			"An interrupted run (Ctrl-C, kill) resumes: FILE.journal lists the tensors already durable in\n" +
			"FILE.partial, and the same command run again writes only the others (other inputs or options\n" +
			"start over). Both are removed once FILE is complete.\n" +
			"--mmproj writes the vision tower instead, as convert_hf_to_gguf.py --mmproj does: a clip GGUF\n" +
			"(general.type mmproj, projector qwen3vl_merger) for llama.cpp's --mmproj and LM Studio, next to the\n" +
			"text GGUF; its image mean and std come from preprocessor_config.json.\n" +
			"With --split-max-size or --split-max-tensors the parts FILE-00001-of-0000N.gguf … (FILE without\n" +
			".gguf) are written directly, each as PART.partial, and renamed into place together once all are\n" +
			"whole, the first part last: it is the one readers open, and it appears only with every other.\n" +
			"Supported architectures: " + strings.Join(convert.Supported(), ", ") + "; with --mmproj: " +
			strings.Join(convert.MMProjSupported(), ", ") + ".",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "out", Aliases: []string{"o"}, Usage: "output `FILE` (an existing directory gets <Name>-<size>-<TYPE>.gguf)"},
			&cli.StringFlag{Name: "outtype", Value: "f16", Usage: "f16, bf16, f32, q8_0 or auto"},
			&cli.BoolFlag{Name: "no-mtp", Usage: "drop the MTP/NextN head (mtp.* tensors)"},
			&cli.BoolFlag{Name: "mmproj", Usage: "write the vision tower as a multimodal projector (an mmproj- file: architecture clip, no text weights)"},
			&cli.BoolFlag{Name: "mtp-only", Usage: "write only the MTP head plus token_embd, output_norm and output (an mtp- file)"},
			&cli.StringFlag{Name: "pre", Usage: "tokenizer.ggml.pre `NAME` (default: named from tokenizer.json's pre-tokenizer — qwen2, qwen35, llama-bpe or gpt-2 — or, with a warning, the family's: qwen2 for Qwen2/3 and Qwen3-Next, qwen35 for Qwen3.5/3.6, llama-bpe for Llama)"},
			&cli.StringFlag{Name: "model-name", Usage: "general.name (default from the directory name)"},
			jobsFlag("tensor workers"),
			noSyncFlag(),
			dryRunFlag("plan only: check the checkpoint and print the plan, write nothing"),
			followLinksFlag(),
			jsonFlag("print the result (or the plan with --dry-run) as JSON"),
			lockWaitFlag("the output"),
			splitFlags()[0], splitFlags()[1],
		},
		Action: runGGUFConvert,
	}
}

// ggufConvertResult is what convert prints.
type ggufConvertResult struct {
	Out          string `json:"out"`
	Architecture string `json:"architecture"`
	HFArch       string `json:"hf_architecture"`
	OutType      string `json:"outtype"`
	Tensors      int    `json:"tensors"`
	Bytes        int64  `json:"bytes"`
	InputBytes   int64  `json:"input_bytes"`
	MTPLayers    int    `json:"nextn_predict_layers"`
	// MMProj: the file is the vision tower (--mmproj), architecture clip.
	MMProj  bool `json:"mmproj,omitempty"`
	Resumed int  `json:"resumed_tensors,omitempty"`
	// Files are the parts written, first to last, for a split output.
	Files []string `json:"files,omitempty"`
	// NonFinite lists the tensors holding NaN or ±Inf in the checkpoint
	// (converted as they are), with their counts.
	NonFinite []nonFiniteCount `json:"nonfinite,omitempty"`
	Warnings  []string         `json:"warnings,omitempty"`
	Seconds   float64          `json:"seconds,omitempty"`
	NoSync    bool             `json:"no_sync,omitempty"` // written without fsync (--no-sync)
	DryRun    bool             `json:"dry_run,omitempty"`
	Plan      []string         `json:"plan,omitempty"`
}

func runGGUFConvert(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageErrorf("gguf convert: want exactly one checkpoint DIR, got %d arguments", c.NArg())
	}
	jobs, err := jobsOf(c)
	if err != nil {
		return err
	}
	out := c.String("out")
	if out == "" && !c.Bool("dry-run") {
		return usageErrorf("gguf convert: --out FILE is required")
	}
	outType, err := convert.ParseOutType(c.String("outtype"))
	if err != nil {
		return usageErrorf("gguf convert: --outtype: %v", err)
	}
	if c.Bool("no-mtp") && c.Bool("mtp-only") {
		return usageErrorf("gguf convert: --no-mtp and --mtp-only exclude each other")
	}
	split, err := splitOptionsOf(c)
	if err != nil {
		return err
	}
	dir := c.Args().First()
	ck, err := safetensors.OpenDirOptions(dir, safetensors.DirOptions{FollowExternalLinks: c.Bool("follow-links")})
	if err != nil {
		return err
	}
	defer ck.Close()
	plan, err := convert.NewPlan(ck, convert.Options{
		OutType: outType, NoMTP: c.Bool("no-mtp"), MTPOnly: c.Bool("mtp-only"),
		Pre: c.String("pre"), Name: c.String("model-name"), MMProj: c.Bool("mmproj"), Split: split,
	})
	if err != nil {
		return err
	}
	if out != "" {
		if st, err := os.Stat(out); err == nil && st.IsDir() {
			out = filepath.Join(out, plan.DefaultFileName(c.Bool("mtp-only")))
		}
	}
	res := ggufConvertResult{Out: out, Architecture: plan.Arch, HFArch: plan.HFArch, OutType: string(plan.OutType),
		Tensors: len(plan.Tensors), Bytes: plan.Layout.OutputSize(), InputBytes: plan.InputBytes, MTPLayers: plan.MTPLayers,
		MMProj: plan.MMProj, Warnings: plan.Warnings}
	if plan.Layout.Split != nil && out != "" {
		res.Files = plan.Layout.Files(out)
	}
	for _, w := range plan.Warnings {
		fmt.Fprintf(stderr(c), "gguf convert: warning: %s\n", w)
	}
	if c.Bool("dry-run") {
		res.DryRun = true
		for _, t := range plan.Tensors {
			res.Plan = append(res.Plan, t.String())
		}
		return printConvert(c, res)
	}
	release, err := claimOutput(c, out, false, dir)
	if err != nil {
		return err
	}
	defer release()

	start := time.Now()
	var nf nonFiniteCounts
	pg := newProgress(c, false)
	bar := pg.New("converting", plan.InputBytes, "task", "gguf convert")
	rr, err := convert.Run(c.Context, ck, plan, out, convert.RunOptions{Jobs: jobs, NoSync: c.Bool("no-sync"), Progress: bar.Add, NonFinite: nf.add})
	bar.Close()
	pg.Close()
	if err != nil {
		var lo gguf.Leftover
		if rr != nil {
			lo = rr.Leftover
		}
		return tensorWriteFailed(c.Context, err, out, lo, len(plan.Tensors))
	}
	res.Resumed = rr.Resumed
	res.Seconds = time.Since(start).Seconds()
	res.NoSync = c.Bool("no-sync")
	res.NonFinite = nf.sorted()
	nf.warn(c.App.ErrWriter, "gguf convert", "in the checkpoint; converted as they are")
	return printConvert(c, res)
}

func printConvert(c *cli.Context, res ggufConvertResult) error {
	if c.Bool("json") {
		return printJSON(c, res)
	}
	w := c.App.Writer
	head := fmt.Sprintf("nextn_predict_layers %d", res.MTPLayers)
	if res.MMProj {
		head = "mmproj: the vision tower, no MTP head"
	}
	if res.DryRun {
		for _, l := range res.Plan {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintf(w, "plan: %s (%s) → %s, %d tensors, %d bytes, %s (nothing written)\n",
			res.HFArch, res.Architecture, res.OutType, res.Tensors, res.Bytes, head)
		printSplitFiles(w, res.Files)
		return nil
	}
	fmt.Fprintf(w, "%s: %s (%s) %s, %d tensors, %d bytes, %s, %.1fs%s\n",
		res.Out, res.HFArch, res.Architecture, res.OutType, res.Tensors, res.Bytes, head, res.Seconds, noSyncNote(res.NoSync))
	printSplitFiles(w, res.Files)
	return nil
}
