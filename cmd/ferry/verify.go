package main

import (
	"fmt"
	"github.com/ferry-llm/ferry/gguf"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/verify"
)

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:      "verify",
		Usage:     "verify that artifacts are fit to serve",
		ArgsUsage: "mtp PATH...",
		Subcommands: []*cli.Command{
			verifyMTPCommand(),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return usageErrorf("'ferry verify' needs a check: 'ferry verify mtp PATH...'")
			}
			// Structural and checksum verification of a whole artifact is
			// not built; say so rather than pass.
			return fmt.Errorf("'ferry verify PATH' (structure and checksums) is %w yet; 'ferry verify mtp PATH...' checks the MTP head", errkind.ErrNotBuilt)
		},
	}
}

func verifyMTPCommand() *cli.Command {
	return &cli.Command{
		Name:      "mtp",
		Usage:     "prove the MTP/NextN head is in the weight index (GGUF file, safetensors or MLX directory)",
		ArgsUsage: "PATH...",
		Description: "Compares what the config or GGUF metadata promises (mtp_num_hidden_layers, num_nextn_predict_layers,\n" +
			"<arch>.nextn_predict_layers) with the head tensors in the weight index: present, shapes consistent with\n" +
			"the trunk, dtypes consistent. Reads headers and the index only, unless --deep.\n\n" +
			"Verdicts: ok, absent (exit 0; absent exits 3 with --require), dropped, partial, inconsistent (exit 3);\n" +
			"not_applicable for an mmproj (a vision tower loaded beside a text GGUF: it has no head; exit 0, --require too).\n\n" +
			"--deep reads the head's bytes: F32/F16/BF16/F8 values all finite and not all zero; GGUF Q8_0 block\n" +
			"scales finite and some value nonzero; Q4_0/Q4_1/Q5_0/Q5_1 and K-quant (Q2_K…Q6_K) fp16 d/dmin finite and\n" +
			"not all zero; packed or integer data (MLX U32 weights, other GGUF types) only not all zero bytes.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "require", Usage: "fail (exit 3) when a model has no MTP head at all (absent)"},
			&cli.BoolFlag{Name: "deep", Usage: "also read the head's tensor bytes: finite, not all zero"},
			followLinksFlag(),
			jsonFlag("print the reports as JSON"),
		},
		Action: runVerifyMTP,
	}
}

func runVerifyMTP(c *cli.Context) error {
	if c.NArg() == 0 {
		return usageErrorf("'ferry verify mtp' needs at least one PATH (a GGUF file, a safetensors or MLX directory)")
	}
	opts := verify.Options{Deep: c.Bool("deep"), Require: c.Bool("require"), FollowLinks: c.Bool("follow-links")}
	var results []verify.Result
	var firstErr error
	args, folded := foldSplitParts(c.Args().Slice())
	for _, p := range args {
		r, err := verify.Check(p, p, opts)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		results = append(results, r)
	}
	sum := verify.Summarize(opts, results)
	if c.Bool("json") {
		if err := printJSON(c, sum); err != nil {
			return err
		}
	} else {
		writeMTPTable(c.App.Writer, results, opts)
		for _, f := range folded {
			fmt.Fprintf(c.App.Writer, "\n%s: %s\n", f[0], f[1])
		}
	}
	if firstErr != nil {
		return firstErr
	}
	if failed := len(sum.Failed()); failed > 0 {
		return verifyFailed(fmt.Errorf("MTP verification failed for %d of %d path(s)", failed, len(results)))
	}
	return nil
}

// foldSplitParts drops from args the later parts of a split GGUF whose
// first part is among them too (a shell glob, out/*.gguf, names every
// part): the first part is checked as the whole model. folded says, for
// each part dropped, which part it was checked through. A later part
// given without its first part stays, and its check says to open the
// first part.
func foldSplitParts(args []string) (kept []string, folded [][2]string) {
	given := map[string]bool{}
	for _, a := range args {
		given[filepath.Clean(a)] = true
	}
	for _, a := range args {
		if prefix, no, count, ok := gguf.ParseSplitName(filepath.Clean(a)); ok && no > 0 {
			if first := gguf.SplitName(prefix, 0, count); given[first] {
				folded = append(folded, [2]string{a, fmt.Sprintf("part %d of %d, checked as part of %s", no+1, count, first)})
				continue
			}
		}
		kept = append(kept, a)
	}
	return kept, folded
}

func writeMTPTable(out io.Writer, results []verify.Result, opts verify.Options) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tFORMAT\tHEAD\tPROMISED\tFOUND\tTENSORS\tVERDICT")
	for _, r := range results {
		if r.Report == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\terror\n", r.Path)
			continue
		}
		head := string(r.Convention)
		if head == "" || r.Verdict == verify.Absent || r.Verdict == verify.NotApplicable {
			head = "-"
		}
		verdict := string(r.Verdict)
		if r.Verdict == verify.Absent && opts.Require {
			verdict += " (required)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\n", r.Path, r.Format, head, r.Promised, len(r.FoundLayers), r.Present, r.Expected, verdict)
	}
	tw.Flush()
	for _, r := range results {
		if r.Report == nil {
			fmt.Fprintf(out, "\n%s: error: %s\n", r.Path, r.Error)
			continue
		}
		detail := !r.Pass || len(r.Warnings) > 0 || opts.Deep || r.Verdict == verify.NotApplicable
		if !detail {
			continue
		}
		if r.Verdict == verify.NotApplicable { // the message starts with "not applicable: "
			fmt.Fprintf(out, "\n%s: %s\n", r.Path, r.Message)
			continue
		}
		fmt.Fprintf(out, "\n%s: %s: %s\n", r.Path, r.Verdict, r.Message)
		if len(r.Missing) > 0 {
			fmt.Fprintf(out, "  missing (%d): %s\n", len(r.Missing), listUpTo(r.Missing, 20))
		}
		for _, p := range upTo(r.Problems, 20) {
			fmt.Fprintf(out, "  problem: %s\n", p)
		}
		for _, w := range r.Warnings {
			fmt.Fprintf(out, "  WARNING: %s\n", w)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(out, "  note: %s\n", n)
		}
		if r.Deep {
			checked := 0
			for _, t := range r.Tensors {
				if t.Present && t.Deep != "" {
					checked++
				}
			}
			fmt.Fprintf(out, "  deep: read %d bytes of %d head tensor(s)\n", r.BytesRead, checked)
			for _, t := range r.Tensors {
				if t.Present && t.Deep != "" {
					fmt.Fprintf(out, "    %s %s %v: %s\n", t.Name, t.DType, t.Shape, t.Deep)
				}
			}
		}
	}
}

func upTo(items []string, n int) []string {
	if len(items) <= n {
		return items
	}
	return append(items[:n:n], fmt.Sprintf("… and %d more", len(items)-n))
}

func listUpTo(items []string, n int) string { return strings.Join(upTo(items, n), ", ") }
