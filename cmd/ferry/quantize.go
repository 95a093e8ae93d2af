package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/internal/progress"
)

func quantizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "quantize",
		Usage:     "quantize a GGUF file (F32/F16/BF16) to Q8_0 or a K-quant mix, byte-identical to llama-quantize",
		ArgsUsage: "IN.gguf OUT.gguf TYPE [NTHREADS]",
		Description: "llama-quantize's argument order. TYPE is Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_L, Q3_K_M,\n" +
			"Q3_K_S, Q2_K or Q2_K_S (needs --imatrix), or a legacy Q4_0, Q4_1, Q5_0, Q5_1 (Q3_K, Q4_K and Q5_K are the _M\n" +
			"mixes), case-insensitive; the tensor types, order, metadata and bytes are llama-quantize's (llama.cpp\n" +
			"34af94c). A trailing NTHREADS, as llama-quantize takes it, is the same as --jobs.\n\n" +
			"--imatrix, --include-weights, --exclude-weights, --tensor-type, --output-tensor-type,\n" +
			"--token-embedding-type, --pure and --leave-output-tensor are llama-quantize's, with its semantics and\n" +
			"bytes. Tensors the matrix has no entry for are quantized without one, as llama-quantize does (the\n" +
			"summary lists them); where llama-quantize would fail on one mid-run (Q2_K_S), ferry refuses before\n" +
			"writing and lists them all. llama-imatrix never runs a Qwen3.5 MTP block, so its tensors have no\n" +
			"entries: --mtp-type TYPE (ferry's own) gives every quantizable MTP/NextN tensor TYPE, leaving every\n" +
			"other tensor as without it (the MTP norms stay F32).\n\n" +
			"Before a byte is written it checks the type, every tensor's input type (a quantized input needs\n" +
			"--allow-requantize), the input's integrity (truncated, tensor data past the end), a header that\n" +
			"promises NextN/MTP layers whose blk.N.nextn.* tensors are missing, the importance matrix, and the\n" +
			"free disk space. Then it quantizes in row blocks (never a whole tensor in memory) into\n" +
			"OUT.gguf.partial and renames it to OUT.gguf; the bytes are the same whatever --jobs. An interrupted\n" +
			"run (Ctrl-C, kill) resumes: OUT.gguf.journal lists the tensors already durable, and the same command\n" +
			"run again writes only the others (another input, type, option or matrix starts over). Both are\n" +
			"removed once OUT.gguf is complete.",
		Flags: append(quantizeOptionFlags(),
			jobsFlag("quantization workers"),
			&cli.BoolFlag{Name: "dry-run", Usage: "plan only: check the input and print every tensor's type, write nothing"},
			jsonFlag("print the result (or the plan with --dry-run) as JSON: every tensor's name, shape, input and output type and bytes, and the totals"),
			lockWaitFlag("the output"),
		),
		Action: runQuantize,
	}
}

// quantizeTensor is one tensor of the --json result.
type quantizeTensor struct {
	Name       string   `json:"name"`
	Shape      []uint64 `json:"shape"`
	InputType  string   `json:"input_type"`
	OutputType string   `json:"output_type"`
	Bytes      int64    `json:"bytes"`
	// Imatrix: quantized with an importance vector.
	Imatrix bool `json:"imatrix,omitempty"`
	// SetBy names the option that set output_type (--tensor-type
	// PATTERN, --output-tensor-type, --token-embedding-type,
	// --leave-output-tensor, --mtp-type); absent for the type rules.
	SetBy string `json:"set_by,omitempty"`
}

// quantizeResult is what quantize prints.
type quantizeResult struct {
	Input        string           `json:"input"`
	Out          string           `json:"out"`
	Type         string           `json:"type"`
	FileType     uint32           `json:"file_type"`
	Architecture string           `json:"architecture"`
	MTPLayers    int              `json:"nextn_predict_layers"`
	Tensors      int              `json:"tensors"`
	Quantized    int              `json:"quantized_tensors"`
	InputBytes   int64            `json:"input_bytes"`
	Bytes        int64            `json:"bytes"`
	Resumed      int              `json:"resumed_tensors,omitempty"`
	Seconds      float64          `json:"seconds,omitempty"`
	DryRun       bool             `json:"dry_run,omitempty"`
	Imatrix      *quantizeImatrix `json:"imatrix,omitempty"`
	Overrides    []string         `json:"overrides,omitempty"`
	TensorList   []quantizeTensor `json:"tensor_list"`
}

// quantizeArgs reads IN OUT TYPE [NTHREADS] and the flags into options.
func quantizeArgs(c *cli.Context) (in, out string, o quantize.Options, jobs int, err error) {
	if c.NArg() < 3 || c.NArg() > 4 {
		return "", "", o, 0, usageErrorf("quantize: want IN.gguf OUT.gguf TYPE [NTHREADS], got %d arguments", c.NArg())
	}
	in, out = c.Args().Get(0), c.Args().Get(1)
	if jobs, err = jobsOf(c); err != nil {
		return
	}
	if c.NArg() == 4 {
		n, perr := strconv.Atoi(c.Args().Get(3))
		if perr != nil || n < 1 {
			return "", "", o, 0, usageErrorf("quantize: NTHREADS %q: want a positive integer", c.Args().Get(3))
		}
		if c.IsSet("jobs") && n != jobs {
			return "", "", o, 0, usageErrorf("quantize: NTHREADS %d and --jobs %d disagree", n, jobs)
		}
		jobs = n
	}
	if o, err = quantizeOptions(c); err != nil {
		return "", "", o, 0, err
	}
	if o.FileType, err = quantize.ParseType(c.Args().Get(2)); err != nil {
		return "", "", o, 0, fmt.Errorf("quantize: %w", err)
	}
	return in, out, o, jobs, nil
}

func runQuantize(c *cli.Context) error {
	in, out, o, jobs, err := quantizeArgs(c)
	if err != nil {
		return err
	}
	f, err := gguf.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	plan, err := quantize.NewPlan(f, o)
	if err != nil {
		return err
	}
	res := quantizeResult{Input: in, Out: out, Type: plan.FileType.String(), FileType: uint32(plan.FileType),
		Architecture: plan.Arch, MTPLayers: plan.MTPLayers, Tensors: len(plan.Tensors),
		InputBytes: plan.InputBytes, Bytes: plan.Layout.Size, Imatrix: imatrixUse(plan), Overrides: overrideLines(plan)}
	for _, t := range plan.Tensors {
		if !t.Copy() {
			res.Quantized++
		}
		res.TensorList = append(res.TensorList, quantizeTensor{Name: t.Name, Shape: t.Dims,
			InputType: t.InType.String(), OutputType: t.Type.String(), Bytes: t.Bytes, Imatrix: t.Weights != nil, SetBy: t.By})
	}
	if c.Bool("dry-run") {
		res.DryRun = true
		return printQuantize(c, res)
	}
	release, err := claimOutput(c, out, false, in)
	if err != nil {
		return err
	}
	defer release()

	start := time.Now()
	pg := newProgress(c, false)
	bar := pg.New("quantizing", plan.InputBytes, "task", "quantize")
	rr, err := quantize.Run(c.Context, f, plan, out, quantize.RunOptions{
		Jobs: jobs, Progress: bar.Add,
		Tensor: func(_ int, name string) { progress.Describe(bar, name) },
	})
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
	return printQuantize(c, res)
}

func printQuantize(c *cli.Context, res quantizeResult) error {
	if c.Bool("json") {
		return printJSON(c, res)
	}
	w := c.App.Writer
	if res.DryRun {
		for _, t := range res.TensorList {
			fmt.Fprintf(w, "%-40s %-20s %5s → %-5s %d bytes\n", t.Name, fmt.Sprint(t.Shape), t.InputType, t.OutputType, t.Bytes)
		}
		fmt.Fprintf(w, "plan: %s → %s (%s), %d tensors (%d quantized), %d bytes, nextn_predict_layers %d (nothing written)\n",
			res.Input, res.Type, res.Architecture, res.Tensors, res.Quantized, res.Bytes, res.MTPLayers)
		printQuantizeChoices(w, res)
		return nil
	}
	fmt.Fprintf(w, "%s: %s (%s), %d tensors (%d quantized), %d bytes from %d, nextn_predict_layers %d, %.1fs\n",
		res.Out, res.Type, res.Architecture, res.Tensors, res.Quantized, res.Bytes, res.InputBytes, res.MTPLayers, res.Seconds)
	printQuantizeChoices(w, res)
	return nil
}

// printQuantizeChoices says which importance matrix was used and which
// options set tensor types.
func printQuantizeChoices(w io.Writer, res quantizeResult) {
	if m := res.Imatrix; m != nil {
		fmt.Fprintf(w, "imatrix: %s (%s, %d entries, %d chunks", m.File, m.Format, m.Entries, m.Chunks)
		if m.Dataset != "" {
			fmt.Fprintf(w, ", dataset %s", m.Dataset)
		}
		fmt.Fprintf(w, "): %d tensors weighted", m.Weighted)
		if len(m.Unweighted) > 0 {
			fmt.Fprintf(w, ", %d without an entry (quantized unweighted, as llama-quantize does): %s", len(m.Unweighted), strings.Join(m.Unweighted, ", "))
		}
		fmt.Fprintln(w)
	}
	for _, l := range res.Overrides {
		fmt.Fprintf(w, "override %s\n", l)
	}
}
