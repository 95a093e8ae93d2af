package inspect

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/ferry-llm/ferry/verify"
)

// WriteText prints the report as inspect shows it: the summary, the
// tensor table and, for a GGUF file, its metadata.
func (rep *Report) WriteText(w io.Writer) error {
	if err := rep.writeTables(w); err != nil {
		return err
	}
	if rep.GGUF != nil {
		return rep.writeGGUFMetadata(w)
	}
	return nil
}

func (rep *Report) writeTables(w io.Writer) error {
	s := rep.Summary
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "path\t%s\n", s.Path)
	fmt.Fprintf(tw, "format\t%s\n", s.Format)
	fmt.Fprintf(tw, "architecture\t%s\n", orNone(s.Architecture))
	fmt.Fprintf(tw, "model_type\t%s\n", orNone(s.ModelType))
	fmt.Fprintf(tw, "tensors\t%d\n", s.Tensors)
	if s.ParameterRule == verify.RuleMLX {
		fmt.Fprintf(tw, "parameters\t%d (as mlx-lm's total_parameters counts them: quantized weights unpacked at their bits; scales, biases and parameters of non-leaf modules not counted)\n", s.Parameters)
	} else {
		fmt.Fprintf(tw, "parameters\t%d\n", s.Parameters)
	}
	fmt.Fprintf(tw, "bytes\t%d\n", s.Bytes)
	dts := make([]string, 0, len(s.BytesPerDType))
	for d := range s.BytesPerDType {
		dts = append(dts, d)
	}
	sort.Strings(dts)
	for _, d := range dts {
		fmt.Fprintf(tw, "bytes %s\t%d\n", d, s.BytesPerDType[d])
	}
	fmt.Fprintf(tw, "shards\t%d\n", s.Shards)
	if s.MMProj != nil {
		fmt.Fprintf(tw, "kind\t%s\n", s.MMProj.Describe())
		fmt.Fprintf(tw, "mtp\tnot applicable (an mmproj is loaded beside a text GGUF and has no MTP head)\n")
	} else {
		fmt.Fprintf(tw, "mtp\t%s\n", describeMTP(s.MTP))
	}
	tw.Flush()
	b.WriteByte('\n')

	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	hashed := len(rep.Tensors) > 0 && rep.Tensors[0].SHA256 != ""
	fmt.Fprint(tw, "NAME\tDTYPE\tSHAPE\tBYTES\tSHARD\tOFFSET")
	if hashed {
		fmt.Fprint(tw, "\tSHA256")
	}
	fmt.Fprintln(tw)
	for _, r := range rep.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d", r.Name, r.DType, formatShape(r.Shape), r.Bytes, r.Shard, r.Offset)
		if hashed {
			fmt.Fprintf(tw, "\t%s", r.SHA256)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	_, err := w.Write(b.Bytes())
	return err
}

func describeMTP(m verify.Head) string {
	var parts []string
	if m.Present {
		parts = append(parts, "present:")
		if m.Tensors > 0 {
			parts = append(parts, fmt.Sprintf("%d mtp.* tensors", m.Tensors))
		}
		if m.NextNTensors > 0 {
			parts = append(parts, fmt.Sprintf("%d tensors in nextn layers %v", m.NextNTensors, m.NextNLayers))
		}
	} else {
		parts = append(parts, "none")
	}
	if m.PromisedBy != "" {
		parts = append(parts, fmt.Sprintf("(config promises %d via %s)", m.Promised, m.PromisedBy))
	} else {
		parts = append(parts, "(config promises none)")
	}
	return strings.Join(parts, " ")
}

func formatShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
