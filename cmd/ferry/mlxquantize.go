package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/mlxpack"
)

func mlxQuantizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "quantize",
		Usage:     "Hugging Face checkpoint → MLX directory, as mlx_lm.convert [-q] writes it",
		ArgsUsage: mlxArgsUsage,
		UsageText: "ferry mlx quantize SRC --out DIR [--bits 4] [--group-size 64] [--recipe mixed_3_6] [--module-bits REGEX=BITS]…\n" +
			"   [--dtype bf16|f16|f32] [--keep-mtp] [-j N] [--dry-run] [--json] [--lock-wait DURATION]\n" +
			mlxOlderForm,
		Description: "Writes what mlx_lm.convert writes (mlx-lm 0.32): the family's sanitize applied (renames, stacked\n" +
			"experts, conv1d layout, the +1 norm shift, tied lm_head dropped), every Linear and Embedding whose\n" +
			"input dimension divides by the group size quantized affine (MLX's bytes exactly), router gates at\n" +
			"8 bits where mlx-lm keeps them so, shards named and split as mlx-lm does, the index, config.json\n" +
			"with quantization and quantization_config, and the tokenizer and generation files. Without\n" +
			"--bits it converts without quantizing (cast with --dtype). A config transformers 5 wrote is fixed\n" +
			"so mlx-lm 0.32 loads it (rope_theta, qwen3_5_text). The MTP head is dropped (mlx-lm discards it;\n" +
			"config.json records the drop) unless --keep-mtp, which keeps it in mtp.safetensors: a file\n" +
			"mlx-lm's loader (model*.safetensors) does not read, so every mlx-lm loads the trunk as without\n" +
			"the head; the index and config.json say where it is. A vision-language Qwen3.5 checkpoint\n" +
			"(Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration) converts as mlx-lm\n" +
			"converts it: its language model, the vision tower (model.visual.*) dropped.\n" +
			"DIR appears complete or not at all: it is built in DIR.partial; an interrupted run (Ctrl-C,\n" +
			"kill) resumes from there when the same command runs again.\n" +
			"Model types: " + strings.Join(mlxpack.SupportedFamilies(), ", ") + ".",
		Flags: append(mlxPathFlags("output `DIR` (must not exist)"),
			&cli.IntFlag{Name: "bits", Usage: "quantize affine at `N` bits (2, 3, 4, 5, 6, 8); without it, no quantization"},
			&cli.IntFlag{Name: "group-size", Value: 64, Usage: "affine group size (32, 64, 128)"},
			&cli.StringFlag{Name: "recipe", Usage: "mlx-lm mixed recipe: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6"},
			&cli.StringSliceFlag{Name: "module-bits", Usage: "quantize modules whose MLX path matches `REGEX=BITS` at BITS (repeatable; the last match wins)"},
			&cli.StringFlag{Name: "dtype", Usage: "cast float weights to bf16, f16 or f32 first (default: config torch_dtype, as mlx-lm)"},
			&cli.BoolFlag{Name: "keep-mtp", Usage: "keep the MTP head (language_model.mtp.*, quantized by the same rules) for loaders that use it, in mtp.safetensors, which mlx-lm's loader does not read"},
			jobsFlag("tensor workers"),
			dryRunFlag("plan only: check the checkpoint and print the plan, write nothing"),
			followLinksFlag(),
			jsonFlag("print the result as JSON, one entry per tensor (module, bits, group size, bytes, quantization error)"),
			lockWaitFlag("the output"),
		),
		Action:       mlxQuantize,
		OnUsageError: mlxUsageError,
	}
}

func mlxQuantize(c *cli.Context) error {
	src, out, jobs, err := mlxArgs(c, c.Bool("dry-run"))
	if err != nil {
		return err
	}
	opts := mlxpack.QuantizeOptions{
		Bits: c.Int("bits"), GroupSize: c.Int("group-size"), Recipe: c.String("recipe"),
		DType: c.String("dtype"), KeepMTP: c.Bool("keep-mtp"), FollowExternalLinks: c.Bool("follow-links"),
	}
	if c.IsSet("bits") && opts.Bits == 0 {
		return usageErrorf("mlx quantize: --bits 0: leave --bits out to convert without quantizing")
	}
	for _, s := range c.StringSlice("module-bits") {
		mb, err := mlxpack.ParseModuleBits(s)
		if err != nil {
			return usageErrorf("mlx quantize: --module-bits: %v", err)
		}
		opts.ModuleBits = append(opts.ModuleBits, mb)
	}
	plan, err := mlxpack.PlanQuantize(src, opts)
	if err != nil {
		return err
	}
	defer plan.Close()
	if c.Bool("dry-run") {
		if c.Bool("json") {
			return printJSON(c, plan)
		}
		w := c.App.Writer
		for _, t := range plan.Tensors {
			q := "float"
			if t.Quantized() {
				q = fmt.Sprintf("%d-bit g%d", t.Bits, t.GroupSize)
			}
			fmt.Fprintf(w, "%-60s %-5s %v %s\n", t.Name, t.DType, t.Shape, q)
		}
		fmt.Fprintf(w, "plan: %s, %d tensors, %d bytes in %d files (nothing written)\n", plan.ModelType, len(plan.Tensors), plan.OutputBytes(), len(plan.Files))
		return nil
	}
	for _, f := range plan.ConfigFixes {
		fmt.Fprintf(stderr(c), "mlx quantize: config.json: %s (so mlx-lm 0.32 loads it)\n", f)
	}
	if n := len(plan.MTPDropped); n > 0 {
		fmt.Fprintf(stderr(c), "mlx quantize: MTP head dropped (%d mtp.* tensors), as mlx-lm does; config.json records it; --keep-mtp keeps it\n", n)
	}
	if plan.MTPKept > 0 {
		fmt.Fprintf(stderr(c), "mlx quantize: MTP head kept (%d tensors as language_model.mtp.*) in %s, which mlx-lm's loader does not read: every mlx-lm loads the trunk alone, as without the head; the index lists the head's tensors for loaders that use it\n", plan.MTPKept, strings.Join(plan.MTPSideFiles(), ", "))
	}
	var res *mlxpack.QuantizeResult
	var start time.Time
	err = mlxWrite(c, src, out, "converting", plan.SourceBytes(), func(progress func(int64)) (err error) {
		start = time.Now()
		res, err = mlxpack.Quantize(c.Context, plan, out, mlxpack.QuantizeRunOptions{Jobs: jobs, Progress: progress})
		if ierr := interruptedResume(c.Context, err, "%s was not written; what is durable is in %s", out, mlxpack.PartialDir(out)); ierr != nil {
			return ierr
		}
		return err
	})
	if err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(c, res)
	}
	w := c.App.Writer
	q := "no quantization"
	if res.Quantization != nil {
		q = quantSummary(res.Quantization)
	}
	fmt.Fprintf(w, "%s → %s\n  model_type %s, %s, %d tensors, %d bytes, %.1fs\n", res.Src, res.Out, res.ModelType, q, len(res.Tensors), res.OutputBytes, time.Since(start).Seconds())
	if res.ResumedUnits > 0 {
		fmt.Fprintf(w, "  resumed: %d row blocks were already written\n", res.ResumedUnits)
	}
	return nil
}
