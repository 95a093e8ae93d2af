// Package inspect describes a model's weights tensor by tensor: a
// safetensors file, a Hugging Face checkpoint or PEFT adapter directory, or
// a GGUF file, read from their headers (and, to hash, every tensor's bytes).
// The report is what `ferry inspect` prints as a table, as JSON (--json) and
// as Parquet (--parquet).
package inspect

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/progress"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/verify"
)

// Row is one tensor of an inspected file, for the table, --json and
// --parquet alike. Formats other than safetensors (gguf.go) fill
// the same fields: DType is the format's own type name, Shape its own
// dimension order, Offset the absolute file offset of the tensor's data.
type Row struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Bytes  int64   `json:"bytes"`
	Shard  string  `json:"shard"`
	Offset int64   `json:"offset"`
	SHA256 string  `json:"sha256,omitempty"`
}

// Summary describes a whole inspected file or checkpoint.
type Summary struct {
	Path          string           `json:"path"`
	Format        string           `json:"format"`
	Architecture  string           `json:"architecture,omitempty"`
	ModelType     string           `json:"model_type,omitempty"`
	Tensors       int              `json:"tensors"`
	Parameters    int64            `json:"parameters"`
	ParameterRule string           `json:"parameter_rule"` // how Parameters counted: verify.RuleElements, or verify.RuleMLX for an MLX directory (the index's total_parameters)
	Bytes         int64            `json:"bytes"`
	BytesPerDType map[string]int64 `json:"bytes_per_dtype"`
	Shards        int              `json:"shards"`
	ShardFiles    []string         `json:"shard_files"`
	MTP           verify.Head      `json:"mtp"` // found by verify, which decides where a head is
	// MMProj is set for a multimodal projector GGUF (general.type mmproj,
	// architecture clip): its vision tower, as its clip.* keys describe it.
	MMProj *gguf.MMProj `json:"mmproj,omitempty"`
}

// KV is one GGUF metadata pair as inspect shows it.
type KV struct {
	Key   string `json:"key"`
	Type  string `json:"type"` // UINT32, STRING, ARRAY[STRING], …
	Value any    `json:"value"`
}

// Report is what inspect prints: --json marshals it as is. GGUF is set
// for a GGUF file (its fields sit between the summary and the rows).
type Report struct {
	Summary Summary `json:"summary"`
	*GGUF
	Tensors []Row `json:"tensors"`
}

// GGUF is what a GGUF file adds to the report: its header and metadata.
type GGUF struct {
	Version  uint32 `json:"gguf_version"`
	Align    uint64 `json:"alignment"`
	DataOff  int64  `json:"data_offset"`
	Metadata []KV   `json:"metadata"`
}

// Options tune Path.
type Options struct {
	// FollowLinks accepts shards that are symlinks leaving the directory.
	FollowLinks bool
	// Hash reads every tensor and fills each row's SHA256, Jobs tensors at
	// a time (at least 1), reporting the bytes hashed to Progress (may be
	// nil).
	Hash     bool
	Jobs     int
	Progress progress.Reporter
}

// Path inspects the file or directory at path.
func Path(ctx context.Context, path string, opts Options) (*Report, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var (
		rep      *Report
		sections []hashing.Section
		closeAll func()
	)
	if !st.IsDir() && IsGGUF(path) {
		rep, sections, closeAll, err = ggufReport(path)
	} else {
		rep, sections, closeAll, err = safetensorsReport(path, st.IsDir(), safetensors.DirOptions{FollowExternalLinks: opts.FollowLinks})
	}
	if err != nil {
		return nil, err
	}
	defer closeAll()
	if opts.Hash {
		if err := hashRows(ctx, rep.Tensors, sections, opts); err != nil {
			return nil, fmt.Errorf("%s: hashing: %w", path, err)
		}
	}
	return rep, nil
}

// hashRows fills rows' SHA256 from sections.
func hashRows(ctx context.Context, rows []Row, sections []hashing.Section, opts Options) error {
	var total int64
	for _, s := range sections {
		total += s.Size()
	}
	var add func(int64)
	if opts.Progress != nil {
		opts.Progress.SetTotal(total)
		add = opts.Progress.Add
	}
	digests, err := hashing.Sections(ctx, sections, max(opts.Jobs, 1), add)
	if err != nil {
		return rowHashError(rows, err)
	}
	for i, d := range digests {
		rows[i].SHA256 = hex.EncodeToString(d[:])
	}
	return nil
}

// IsGGUF reports whether path is a GGUF file (by extension or magic).
func IsGGUF(path string) bool {
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

// input is an opened safetensors input: its tensors in row order,
// its files, and its config (nil when there is none).
type input struct {
	path   string
	locs   []safetensors.Location
	shards []*safetensors.Shard
	cfg    *safetensors.Config
	close  func()
}

// openInput opens a checkpoint directory, a PEFT adapter directory
// (its adapter_model.safetensors) or a single .safetensors file.
func openInput(path string, isDir bool, opt safetensors.DirOptions) (*input, error) {
	if isDir {
		ck, err := safetensors.OpenDirOptions(path, opt)
		if err == nil {
			return &input{path: path, locs: ck.Tensors(), shards: ck.Shards, cfg: ck.Config, close: func() { ck.Close() }}, nil
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
	in := &input{path: path, close: func() { f.Close() }}
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

// safetensorsReport builds the report for a file or directory and returns
// the tensors' sections (in row order) for hashing.
func safetensorsReport(path string, isDir bool, opt safetensors.DirOptions) (*Report, []hashing.Section, func(), error) {
	in, err := openInput(path, isDir, opt)
	if err != nil {
		return nil, nil, nil, err
	}
	path, locs, shards, cfg := in.path, in.locs, in.shards, in.cfg
	rep := &Report{Summary: Summary{
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
	rep.Tensors = make([]Row, 0, len(locs))
	sections := make([]hashing.Section, 0, len(locs))
	names := make([]string, 0, len(locs))
	for _, l := range locs {
		t := l.Info
		rep.Tensors = append(rep.Tensors, Row{
			Name:   t.Name,
			DType:  string(t.DType),
			Shape:  t.Shape,
			Bytes:  t.Size(),
			Shard:  l.Shard.Name,
			Offset: l.Shard.DataOffset() + t.Begin,
		})
		sections = append(sections, l.Section())
		names = append(names, t.Name)
		rep.Summary.Bytes += t.Size()
		rep.Summary.BytesPerDType[string(t.DType)] += t.Size()
	}
	rep.Summary.MTP = verify.FindHead(names, cfg)
	if rep.Summary.Parameters, rep.Summary.ParameterRule, err = verify.Parameters(locs, cfg); err != nil {
		in.close()
		return nil, nil, nil, err
	}
	return rep, sections, in.close, nil
}

// rowHashError names the shard, tensor and absolute offset of a failed
// read (a file shortened or unreadable after its header was checked).
func rowHashError(rows []Row, err error) error {
	var se *hashing.SectionError
	if !errors.As(err, &se) || se.Index < 0 || se.Index >= len(rows) {
		return err
	}
	r := rows[se.Index]
	return fmt.Errorf("shard %s: tensor %q at offset %d: %w", r.Shard, r.Name, r.Offset+se.Offset, se.Err)
}
