package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/internal/progress"
)

func quantizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "quantize",
		Usage:     "quantize a GGUF file (F32/F16/BF16) or a safetensors checkpoint to Q8_0 or K-quant mixes, byte-identical to llama-quantize",
		ArgsUsage: "IN.gguf OUT.gguf TYPE [NTHREADS]  |  --type TYPE,TYPE… --out-dir DIR IN [NTHREADS]",
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
			"removed once OUT.gguf is complete.\n\n" +
			"--split-max-size N(M|G) or --split-max-tensors N writes OUT-00001-of-0000N.gguf … directly: the parts\n" +
			"llama-gguf-split --split makes of the unsplit OUT.gguf, byte for byte, each as PART.partial until all\n" +
			"are whole, the first part renamed into place last. IN may be the first part of a split\n" +
			"(IN-00001-of-0000N.gguf): every part is read, and a missing or foreign part is an error naming it.\n\n" +
			"IN may also be a Hugging Face checkpoint directory (a base or a merge output): it is converted on the\n" +
			"fly as `ferry gguf convert --outtype f16` would (families, MTP, tokenizer, --no-mtp), never written, and\n" +
			"the output is llama-quantize's from convert_hf_to_gguf.py's F16 file, byte for byte.\n\n" +
			"With --type T1,T2,… --out-dir DIR, one run reads IN once and writes DIR/<name>-<TYPE>.gguf for every\n" +
			"type (name: IN's file name without .gguf and a trailing -F16/-BF16/-F32, or the checkpoint directory's\n" +
			"name), each the same file a run of that type alone writes, each with its own .partial and journal.\n" +
			"It prints a short quality table per output (size, bits per weight, mean and max error, the worst\n" +
			"tensors), measured while quantizing; --report and --report-svg save it (in either form).",
		Flags: append(quantizeOptionFlags(),
			jobsFlag("quantization workers"),
			noSyncFlag(),
			dryRunFlag("plan only: check the input and print every tensor's type, write nothing"),
			jsonFlag("print the result (or the plan with --dry-run) as JSON: every tensor's name, shape, input and output type and bytes, and the totals"),
			lockWaitFlag("the output"),
			&cli.StringFlag{Name: "type", Usage: "quantize to each of the comma-separated `TYPES` in one read of IN (with --out-dir)"},
			&cli.StringFlag{Name: "out-dir", Usage: "write each --type's output as `DIR`/<name>-<TYPE>.gguf"},
			&cli.StringFlag{Name: "report", Usage: "write the quality report to `FILE.parquet`: one row per output × tensor (type, parameters, bytes, bits per weight, RMSE, relative RMSE, max abs error, cosine similarity)"},
			&cli.StringFlag{Name: "report-svg", Usage: "write a chart of the error per layer, one line per output type, to `FILE.svg`"},
			&cli.BoolFlag{Name: "no-mtp", Usage: "with a checkpoint IN: drop the mtp.* tensors, as gguf convert --no-mtp"},
			followLinksFlag(),
			splitFlags()[0], splitFlags()[1],
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
	NoSync       bool             `json:"no_sync,omitempty"` // written without fsync (--no-sync)
	DryRun       bool             `json:"dry_run,omitempty"`
	Imatrix      *quantizeImatrix `json:"imatrix,omitempty"`
	Overrides    []string         `json:"overrides,omitempty"`
	// Files are the parts written, first to last, for a split output.
	Files      []string         `json:"files,omitempty"`
	TensorList []quantizeTensor `json:"tensor_list"`
	// Quality is the output's error summary, measured while quantizing
	// (--type/--out-dir, --report, --report-svg).
	Quality *quantizeQuality `json:"quality,omitempty"`
}

// quantizeArgs reads IN OUT TYPE [NTHREADS], or IN [NTHREADS] with
// --type and --out-dir, and the flags into options: one per output, with
// its path.
func quantizeArgs(c *cli.Context) (in string, outs []quantizeOut, jobs int, err error) {
	multi := c.IsSet("type") || c.IsSet("out-dir")
	var threads string
	switch {
	case multi && (c.NArg() < 1 || c.NArg() > 2):
		return "", nil, 0, usageErrorf("quantize: with --type and --out-dir, want IN [NTHREADS], got %d arguments", c.NArg())
	case multi && (!c.IsSet("type") || !c.IsSet("out-dir")):
		return "", nil, 0, usageErrorf("quantize: --type and --out-dir go together (or give IN OUT TYPE)")
	case multi:
		threads = c.Args().Get(1)
	case c.NArg() < 3 || c.NArg() > 4:
		return "", nil, 0, usageErrorf("quantize: want IN.gguf OUT.gguf TYPE [NTHREADS], got %d arguments", c.NArg())
	default:
		threads = c.Args().Get(3)
	}
	in = c.Args().Get(0)
	if jobs, err = jobsOf(c); err != nil {
		return
	}
	if threads != "" {
		n, perr := strconv.Atoi(threads)
		if perr != nil || n < 1 {
			return "", nil, 0, usageErrorf("quantize: NTHREADS %q: want a positive integer", threads)
		}
		if c.IsSet("jobs") && n != jobs {
			return "", nil, 0, usageErrorf("quantize: NTHREADS %d and --jobs %d disagree", n, jobs)
		}
		jobs = n
	}
	o, err := quantizeOptions(c)
	if err != nil {
		return "", nil, 0, err
	}
	if o.Split, err = splitOptionsOf(c); err != nil {
		return "", nil, 0, err
	}
	if !multi {
		if o.FileType, err = quantize.ParseType(c.Args().Get(2)); err != nil {
			return "", nil, 0, fmt.Errorf("quantize: %w", err)
		}
		return in, []quantizeOut{{opts: o, path: c.Args().Get(1)}}, jobs, nil
	}
	seen := map[quant.FileType]bool{}
	for _, name := range strings.Split(c.String("type"), ",") {
		ft, err := quantize.ParseType(strings.TrimSpace(name))
		if err != nil {
			return "", nil, 0, fmt.Errorf("quantize: --type: %w", err)
		}
		if seen[ft] {
			return "", nil, 0, usageErrorf("quantize: --type names %s twice", ft)
		}
		seen[ft] = true
		to := o
		to.FileType = ft
		outs = append(outs, quantizeOut{opts: to, path: filepath.Join(c.String("out-dir"), quantize.OutputName(quantize.Stem(in), ft))})
	}
	return in, outs, jobs, nil
}

// quantizeOut is one output a command line asks for.
type quantizeOut struct {
	opts quantize.Options
	path string
}

// quantizeRun is what a multi-output quantize prints: its input and each
// output's result.
type quantizeRun struct {
	Input   string           `json:"input"`
	Seconds float64          `json:"seconds,omitempty"`
	NoSync  bool             `json:"no_sync,omitempty"` // written without fsync (--no-sync)
	DryRun  bool             `json:"dry_run,omitempty"`
	Outputs []quantizeResult `json:"outputs"`
}

// quantizeQuality is an output's quality summary in --json.
type quantizeQuality struct {
	BitsPerWeight float64                 `json:"bits_per_weight"`
	RMSE          float64                 `json:"rmse"`
	RelativeRMSE  float64                 `json:"relative_rmse"`
	MaxAbsError   float64                 `json:"max_abs_error"`
	Worst         []quantizeTensorQuality `json:"worst_tensors"`
}

type quantizeTensorQuality struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	RMSE          float64 `json:"rmse"`
	RelativeRMSE  float64 `json:"relative_rmse"`
	MaxAbsError   float64 `json:"max_abs_error"`
	Cosine        float64 `json:"cosine_similarity"`
}

// worstTensors is how many tensors the table and --json list per output.
const worstTensors = 5

func runQuantize(c *cli.Context) error {
	in, qouts, jobs, err := quantizeArgs(c)
	if err != nil {
		return err
	}
	multi := c.IsSet("out-dir")
	src, err := quantize.OpenSource(in, quantize.SourceOptions{NoMTP: c.Bool("no-mtp"), FollowLinks: c.Bool("follow-links")})
	if err != nil {
		return err
	}
	defer src.Close()
	if src.Convert != nil {
		for _, w := range src.Convert.Warnings {
			fmt.Fprintf(stderr(c), "quantize: warning: %s\n", w)
		}
	}
	run := quantizeRun{Input: in}
	var outs []quantize.Output
	var inputBytes int64
	for _, q := range qouts {
		plan, err := src.NewPlan(q.opts)
		if err != nil {
			return err
		}
		outs = append(outs, quantize.Output{Plan: plan, Path: q.path})
		inputBytes = plan.InputBytes
		res := quantizeResult{Input: in, Out: q.path, Type: plan.FileType.String(), FileType: uint32(plan.FileType),
			Architecture: plan.Arch, MTPLayers: plan.MTPLayers, Tensors: len(plan.Tensors),
			InputBytes: plan.InputBytes, Bytes: plan.Layout.OutputSize(), Imatrix: imatrixUse(plan), Overrides: overrideLines(plan)}
		if plan.Layout.Split != nil {
			res.Files = plan.Layout.Files(q.path)
		}
		for _, t := range plan.Tensors {
			if !t.Copy() {
				res.Quantized++
			}
			res.TensorList = append(res.TensorList, quantizeTensor{Name: t.Name, Shape: t.Dims,
				InputType: t.InType.String(), OutputType: t.Type.String(), Bytes: t.Bytes, Imatrix: t.Weights != nil, SetBy: t.By})
		}
		run.Outputs = append(run.Outputs, res)
	}
	if c.Bool("dry-run") {
		run.DryRun = true
		for k := range run.Outputs {
			run.Outputs[k].DryRun = true
		}
		return printQuantizeRun(c, run, multi, nil)
	}
	claim, isDir := qouts[0].path, false
	if multi {
		claim, isDir = c.String("out-dir"), true
	}
	release, err := claimOutput(c, claim, isDir, in)
	if err != nil {
		return err
	}
	defer release()
	if multi {
		if err := os.MkdirAll(claim, 0o755); err != nil {
			return err
		}
	}

	start := time.Now()
	pg := newProgress(c, false)
	bar := pg.New("quantizing", inputBytes, "task", "quantize")
	measure := multi || c.IsSet("report") || c.IsSet("report-svg")
	rrs, err := quantize.RunMulti(c.Context, src.File, outs, quantize.RunOptions{
		Jobs: jobs, NoSync: c.Bool("no-sync"), Progress: bar.Add, Errors: measure,
		Tensor: func(_ int, name string) { progress.Describe(bar, name) },
	})
	bar.Close()
	pg.Close()
	if err != nil {
		for k, rr := range rrs {
			if rr != nil && rr.Partial != "" {
				// Name every output's leftover; the error carries the first.
				if k > 0 {
					fmt.Fprintf(stderr(c), "quantize: %s was not written: %d of %d tensors are durable in %s\n", outs[k].Path, rr.Durable, len(outs[k].Plan.Tensors), rr.Partial)
				}
			}
		}
		var lo gguf.Leftover
		if len(rrs) > 0 && rrs[0] != nil {
			lo = rrs[0].Leftover
		}
		return tensorWriteFailed(c.Context, err, outs[0].Path, lo, len(outs[0].Plan.Tensors))
	}
	run.Seconds = time.Since(start).Seconds()
	run.NoSync = c.Bool("no-sync")
	var reports []quantize.OutputReport
	for k, rr := range rrs {
		run.Outputs[k].Resumed = rr.Resumed
		run.Outputs[k].Seconds = run.Seconds
		run.Outputs[k].NoSync = run.NoSync
		if !measure {
			continue
		}
		r, err := quantize.NewOutputReport(outs[k], rr)
		if err != nil {
			return err
		}
		reports = append(reports, r)
		run.Outputs[k].Quality = qualityOf(&r)
	}
	if p := c.String("report"); p != "" {
		if err := quantize.WriteReportParquet(p, reports, "ferry "+version); err != nil {
			return err
		}
	}
	if p := c.String("report-svg"); p != "" {
		if err := quantize.WriteReportSVG(p, reports); err != nil {
			return err
		}
	}
	return printQuantizeRun(c, run, multi, reports)
}

func qualityOf(r *quantize.OutputReport) *quantizeQuality {
	s := r.Summary()
	q := &quantizeQuality{BitsPerWeight: s.BitsPerWeight, RMSE: s.RMSE, RelativeRMSE: s.RelRMSE, MaxAbsError: s.MaxAbs}
	for _, t := range r.Worst(worstTensors) {
		q.Worst = append(q.Worst, quantizeTensorQuality{Name: t.Name, Type: t.Type.String(), BitsPerWeight: t.BitsPerWeight(),
			RMSE: t.RMSE, RelativeRMSE: t.RelRMSE, MaxAbsError: t.MaxAbs, Cosine: t.Cosine})
	}
	return q
}

// printQuantizeRun prints a run: a single-output run as it always has
// (its --json the one result), a multi-output run as each output's line
// and quality table (its --json every result).
func printQuantizeRun(c *cli.Context, run quantizeRun, multi bool, reports []quantize.OutputReport) error {
	if !multi {
		if err := printQuantize(c, run.Outputs[0]); err != nil {
			return err
		}
	} else if c.Bool("json") {
		return printJSON(c, run)
	} else {
		for _, res := range run.Outputs {
			if err := printQuantize(c, res); err != nil {
				return err
			}
		}
	}
	if c.Bool("json") {
		return nil
	}
	for k := range reports {
		if err := reports[k].WriteTable(c.App.Writer, worstTensors); err != nil {
			return err
		}
	}
	return nil
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
		printSplitFiles(w, res.Files)
		printQuantizeChoices(w, res)
		return nil
	}
	fmt.Fprintf(w, "%s: %s (%s), %d tensors (%d quantized), %d bytes from %d, nextn_predict_layers %d, %.1fs%s\n",
		res.Out, res.Type, res.Architecture, res.Tensors, res.Quantized, res.Bytes, res.InputBytes, res.MTPLayers, res.Seconds, noSyncNote(res.NoSync))
	printSplitFiles(w, res.Files)
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
