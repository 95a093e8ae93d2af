package main

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/urfave/cli/v2"

	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/safetensors"
)

// inspectRow is one tensor of an inspected file, for the table, --json and
// --parquet alike. Formats other than safetensors (inspect_gguf.go) fill
// the same fields: DType is the format's own type name, Shape its own
// dimension order, Offset the absolute file offset of the tensor's data.
type inspectRow struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Bytes  int64   `json:"bytes"`
	Shard  string  `json:"shard"`
	Offset int64   `json:"offset"`
	SHA256 string  `json:"sha256,omitempty"`
}

// inspectMTP says whether multi-token-prediction weights are present and
// what the config promises.
type inspectMTP struct {
	Present bool `json:"present"`
	// Tensors counts Qwen-style `mtp.*` tensors (also `….mtp.…`).
	Tensors int `json:"tensors"`
	// NextNLayers and NextNTensors count DeepSeek-style layers with index
	// ≥ num_hidden_layers, looked for when num_nextn_predict_layers is set.
	NextNLayers  []int `json:"nextn_layers,omitempty"`
	NextNTensors int   `json:"nextn_tensors"`
	// Promised is the layer count the config declares, and PromisedBy the
	// key it came from ("" when the config declares none).
	Promised   int64  `json:"promised_layers"`
	PromisedBy string `json:"promised_by,omitempty"`
}

// inspectSummary describes a whole inspected file or checkpoint.
type inspectSummary struct {
	Path          string           `json:"path"`
	Format        string           `json:"format"`
	Architecture  string           `json:"architecture,omitempty"`
	ModelType     string           `json:"model_type,omitempty"`
	Tensors       int              `json:"tensors"`
	Parameters    int64            `json:"parameters"`
	Bytes         int64            `json:"bytes"`
	BytesPerDType map[string]int64 `json:"bytes_per_dtype"`
	Shards        int              `json:"shards"`
	ShardFiles    []string         `json:"shard_files"`
	MTP           inspectMTP       `json:"mtp"`
}

// inspectReport is what inspect prints: --json marshals it as is.
type inspectReport struct {
	Summary inspectSummary `json:"summary"`
	Tensors []inspectRow   `json:"tensors"`
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "summarise a safetensors file or checkpoint directory (or a GGUF file), tensor by tensor",
		ArgsUsage: "PATH",
		Description: "PATH is a .safetensors file, a Hugging Face checkpoint directory (model.safetensors or\n" +
			"shards + model.safetensors.index.json), a PEFT adapter directory, or a .gguf file.\n" +
			"Prints a summary (architecture, tensors, parameters, bytes per dtype, shards, MTP tensors)\n" +
			"and a per-tensor table (name, dtype, shape, bytes, shard, absolute data offset).",
		Flags: []cli.Flag{
			jsonFlag("print the summary and rows as JSON"),
			&cli.BoolFlag{Name: "hash", Usage: "add each tensor's sha256 (reads every byte)"},
			jobsFlag("tensors hashed in parallel with --hash"),
			&cli.StringFlag{Name: "parquet", Usage: "also write the per-tensor table as Parquet to `FILE`"},
			followLinksFlag(),
			lockWaitFlag("the --parquet file"),
		},
		Action: runInspect,
	}
}

func runInspect(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageErrorf("inspect: want exactly one PATH, got %d arguments", c.NArg())
	}
	if _, err := jobsOf(c); err != nil {
		return err
	}
	path := c.Args().First()
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := checkParquetDest(c.String("parquet")); err != nil {
		return err
	}
	if p := c.String("parquet"); p != "" {
		release, err := claimOutput(c, p, false, path)
		if err != nil {
			return err
		}
		defer release()
	}
	if !st.IsDir() && isGGUF(path) {
		return inspectGGUF(c, path)
	}
	rep, sections, closeAll, err := inspectSafetensors(path, st.IsDir(), safetensors.DirOptions{FollowExternalLinks: c.Bool("follow-links")})
	if err != nil {
		return err
	}
	defer closeAll()
	if c.Bool("hash") {
		if err := hashRows(c, rep.Tensors, sections); err != nil {
			return fmt.Errorf("%s: hashing: %w", path, err)
		}
	}
	return emitInspect(c, rep)
}

// emitInspect writes --parquet (if asked) and prints the report; other
// formats' inspectors end with it too.
func emitInspect(c *cli.Context, rep *inspectReport) error {
	if p := c.String("parquet"); p != "" {
		if err := writeInspectParquet(p, rep.Tensors); err != nil {
			return err
		}
	}
	if c.Bool("json") {
		return printJSON(c, rep)
	}
	return printInspect(c.App.Writer, rep)
}

func isGGUF(path string) bool {
	if strings.EqualFold(filepath.Ext(path), ".gguf") {
		return true
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == "GGUF"
}

// inspectInput is an opened safetensors input: its tensors in row order,
// its files, and its config (nil when there is none).
type inspectInput struct {
	path   string
	locs   []safetensors.Location
	shards []*safetensors.Shard
	cfg    *safetensors.Config
	close  func()
}

// openInspectInput opens a checkpoint directory, a PEFT adapter directory
// (its adapter_model.safetensors) or a single .safetensors file.
func openInspectInput(path string, isDir bool, opt safetensors.DirOptions) (*inspectInput, error) {
	if isDir {
		ck, err := safetensors.OpenDirOptions(path, opt)
		if err == nil {
			return &inspectInput{path: path, locs: ck.Tensors(), shards: ck.Shards, cfg: ck.Config, close: func() { ck.Close() }}, nil
		}
		adapter := filepath.Join(path, "adapter_model.safetensors")
		if !errors.Is(err, safetensors.ErrNotCheckpoint) || !fileExists(adapter) {
			return nil, err
		}
		if err := safetensors.CheckLinks(path, opt); err != nil {
			return nil, err
		}
		path = adapter
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	in := &inspectInput{path: path, close: func() { f.Close() }}
	sh := &safetensors.Shard{Name: filepath.Base(path), File: f}
	for _, t := range f.Tensors {
		in.locs = append(in.locs, safetensors.Location{Shard: sh, Info: t})
	}
	in.shards = []*safetensors.Shard{sh}
	// A lone file's architecture comes from a config.json beside it.
	if p := filepath.Join(filepath.Dir(path), "config.json"); fileExists(p) {
		if in.cfg, err = safetensors.ReadConfig(p); err != nil {
			f.Close()
			return nil, err
		}
	}
	return in, nil
}

// inspectSafetensors builds the report for a file or directory and returns
// the tensors' sections (in row order) for hashing.
func inspectSafetensors(path string, isDir bool, opt safetensors.DirOptions) (*inspectReport, []hashing.Section, func(), error) {
	in, err := openInspectInput(path, isDir, opt)
	if err != nil {
		return nil, nil, nil, err
	}
	path, locs, shards, cfg := in.path, in.locs, in.shards, in.cfg
	rep := &inspectReport{Summary: inspectSummary{
		Path:          path,
		Format:        "safetensors",
		Architecture:  cfg.Architecture(),
		Tensors:       len(locs),
		BytesPerDType: map[string]int64{},
		Shards:        len(shards),
		ShardFiles:    []string{},
	}}
	if cfg != nil {
		rep.Summary.ModelType = cfg.ModelType
	}
	for _, sh := range shards {
		rep.Summary.ShardFiles = append(rep.Summary.ShardFiles, sh.Name)
	}
	rep.Tensors = make([]inspectRow, 0, len(locs))
	sections := make([]hashing.Section, 0, len(locs))
	names := make([]string, 0, len(locs))
	for _, l := range locs {
		t := l.Info
		rep.Tensors = append(rep.Tensors, inspectRow{
			Name:   t.Name,
			DType:  string(t.DType),
			Shape:  t.Shape,
			Bytes:  t.Size(),
			Shard:  l.Shard.Name,
			Offset: l.Shard.DataOffset() + t.Begin,
		})
		sections = append(sections, l.Section())
		names = append(names, t.Name)
		rep.Summary.Parameters += t.NumElements()
		rep.Summary.Bytes += t.Size()
		rep.Summary.BytesPerDType[string(t.DType)] += t.Size()
	}
	rep.Summary.MTP = mtpSummary(names, cfg)
	return rep, sections, in.close, nil
}

var layerRE = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.`)

func mtpSummary(names []string, cfg *safetensors.Config) inspectMTP {
	var m inspectMTP
	for _, key := range []string{"mtp_num_hidden_layers", "num_nextn_predict_layers"} {
		if n, ok := cfg.Int(key); ok && m.PromisedBy == "" {
			m.Promised, m.PromisedBy = n, key
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "mtp.") || strings.Contains(n, ".mtp.") {
			m.Tensors++
		}
	}
	if _, ok := cfg.Int("num_nextn_predict_layers"); ok {
		if hidden, ok := cfg.Int("num_hidden_layers"); ok {
			layers := map[int]bool{}
			for _, n := range names {
				mm := layerRE.FindStringSubmatch(n)
				if mm == nil || strings.HasPrefix(n, "mtp.") {
					continue
				}
				if i, err := strconv.Atoi(mm[1]); err == nil && int64(i) >= hidden {
					m.NextNTensors++
					layers[i] = true
				}
			}
			for i := range layers {
				m.NextNLayers = append(m.NextNLayers, i)
			}
			sort.Ints(m.NextNLayers)
		}
	}
	m.Present = m.Tensors > 0 || m.NextNTensors > 0
	return m
}

// hashRows fills rows' SHA256 from sections, reporting progress on stderr.
func hashRows(c *cli.Context, rows []inspectRow, sections []hashing.Section) error {
	var total int64
	for _, s := range sections {
		total += s.Size()
	}
	pg := newProgress(c, false)
	bar := pg.New("hashing", total, "task", "inspect --hash")
	digests, err := hashing.Sections(c.Context, sections, c.Int("jobs"), bar.Add)
	bar.Close()
	pg.Close()
	if err != nil {
		return rowHashError(rows, err)
	}
	for i, d := range digests {
		rows[i].SHA256 = hex.EncodeToString(d[:])
	}
	return nil
}

// checkParquetDest fails early, before any hashing, when --parquet names a
// directory or a file in a directory that does not exist.
func checkParquetDest(p string) error {
	if p == "" {
		return nil
	}
	if st, err := os.Stat(p); err == nil && st.IsDir() {
		return usageErrorf("inspect: --parquet %s is a directory", p)
	}
	if st, err := os.Stat(filepath.Dir(p)); err != nil || !st.IsDir() {
		return usageErrorf("inspect: --parquet %s: directory %s does not exist", p, filepath.Dir(p))
	}
	return nil
}

// rowHashError names the shard, tensor and absolute offset of a failed
// read (a file shortened or unreadable after its header was checked).
func rowHashError(rows []inspectRow, err error) error {
	var se *hashing.SectionError
	if !errors.As(err, &se) || se.Index < 0 || se.Index >= len(rows) {
		return err
	}
	r := rows[se.Index]
	return fmt.Errorf("shard %s: tensor %q at offset %d: %w", r.Shard, r.Name, r.Offset+se.Offset, se.Err)
}

func printInspect(w io.Writer, rep *inspectReport) error {
	s := rep.Summary
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "path\t%s\n", s.Path)
	fmt.Fprintf(tw, "format\t%s\n", s.Format)
	fmt.Fprintf(tw, "architecture\t%s\n", orNone(s.Architecture))
	fmt.Fprintf(tw, "model_type\t%s\n", orNone(s.ModelType))
	fmt.Fprintf(tw, "tensors\t%d\n", s.Tensors)
	fmt.Fprintf(tw, "parameters\t%d\n", s.Parameters)
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
	fmt.Fprintf(tw, "mtp\t%s\n", describeMTP(s.MTP))
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

func describeMTP(m inspectMTP) string {
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

// inspectSchema is the Parquet layout of the per-tensor table; sha256 is
// null when --hash was not given.
var inspectSchema = arrow.NewSchema([]arrow.Field{
	{Name: "name", Type: arrow.BinaryTypes.String},
	{Name: "dtype", Type: arrow.BinaryTypes.String},
	{Name: "shape", Type: arrow.ListOf(arrow.PrimitiveTypes.Int64)},
	{Name: "bytes", Type: arrow.PrimitiveTypes.Int64},
	{Name: "shard", Type: arrow.BinaryTypes.String},
	{Name: "offset", Type: arrow.PrimitiveTypes.Int64},
	{Name: "sha256", Type: arrow.BinaryTypes.String, Nullable: true},
}, nil)

// onlyWriter hides the temp file's Close from pqarrow, which closes its
// sink; the AtomicFile must stay open for Commit's fsync and rename.
type onlyWriter struct{ io.Writer }

// writeInspectParquet writes rows to path atomically.
func writeInspectParquet(path string, rows []inspectRow) (err error) {
	b := array.NewRecordBuilder(memory.DefaultAllocator, inspectSchema)
	defer b.Release()
	name := b.Field(0).(*array.StringBuilder)
	dtype := b.Field(1).(*array.StringBuilder)
	shape := b.Field(2).(*array.ListBuilder)
	dims := shape.ValueBuilder().(*array.Int64Builder)
	size := b.Field(3).(*array.Int64Builder)
	shard := b.Field(4).(*array.StringBuilder)
	offset := b.Field(5).(*array.Int64Builder)
	sum := b.Field(6).(*array.StringBuilder)
	for _, r := range rows {
		name.Append(r.Name)
		dtype.Append(r.DType)
		shape.Append(true)
		dims.AppendValues(r.Shape, nil)
		size.Append(r.Bytes)
		shard.Append(r.Shard)
		offset.Append(r.Offset)
		if r.SHA256 == "" {
			sum.AppendNull()
		} else {
			sum.Append(r.SHA256)
		}
	}
	rec := b.NewRecordBatch()
	defer rec.Release()

	af, err := fsutil.CreateAtomic(path)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			af.Abort()
			err = fmt.Errorf("%s: writing parquet: %w", path, err)
		}
	}()
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Snappy), parquet.WithCreatedBy("ferry "+version))
	w, err := pqarrow.NewFileWriter(inspectSchema, onlyWriter{af}, props, pqarrow.DefaultWriterProps())
	if err != nil {
		return err
	}
	if err := w.Write(rec); err != nil {
		w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return af.Commit()
}
