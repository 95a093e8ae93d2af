package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/manifest"
)

// quantizeStage quantizes the GGUF file of a stage (a gguf stage's output)
// with gguf/quantize, byte-identical to llama-quantize.
//
//	quantize: { from: f16, type: Q4_K_M }
//	quantize: { from: f16, types: [Q6_K, Q4_K_M] }
//
// type (one) or types (several, each its own output file, quantized one
// after the other: each reads the input once) is a llama-quantize type
// name, checked when the pipeline file is parsed. output_tensor_type,
// token_embedding_type, leave_output_tensor, pure and allow_requantize
// are llama-quantize's options of those names; tensor_types is its
// --tensor-type, a mapping { REGEX: TYPE } tried in the order written
// (the first match wins); mtp_type is `ferry quantize --mtp-type`. The
// from stage must hold exactly one .gguf file; each output is named after
// it with its type (Jarvis2-27B-F16.gguf → Jarvis2-27B-Q4_K_M.gguf).
//
//	quantize: { from: f16, types: [Q4_K_M, Q2_K_S], imatrix: imat,
//	            tensor_types: { attn_v: q8_0 }, mtp_type: q8_0 }
//
// imatrix is an importance matrix (llama-imatrix's GGUF or .dat output):
// the name of a stage whose outputs hold it (one file, or one .gguf or
// .dat file; quantize.imatrix.file is that file's name), or a path (it
// holds a '/', starts with '~' or ends in .gguf or .dat; relative to the
// pipeline file; quantize.imatrix.file is the path as written). A path's
// digest is part of the stage key, read when the pipeline file is loaded,
// so a changed matrix re-runs the stage; a stage's is, as every input's.
// include_weights and exclude_weights filter it as llama-quantize's
// flags do. Q2_K_S is accepted only with a matrix.
//
// Resume: quantize.Run, which `ferry quantize` calls too, keeps
// <file>.partial and <file>.journal in the stage's work dir; the journal
// records finished tensors after the partial file has been fsynced, so a
// killed run rewrites only the tensors that were not durable (and an
// output already finished is kept).
type quantizeStage struct {
	From            string   `json:"from"`
	Types           []string `json:"types"`
	OutputType      string   `json:"output_tensor_type,omitempty"`
	TokenEmbdType   string   `json:"token_embedding_type,omitempty"`
	LeaveOutput     bool     `json:"leave_output_tensor,omitempty"`
	Pure            bool     `json:"pure,omitempty"`
	AllowRequantize bool     `json:"allow_requantize,omitempty"`
	// TensorTypes are tensor_types in the order written, each
	// [REGEX, TYPE].
	TensorTypes [][2]string `json:"tensor_types,omitempty"`
	MTPType     string      `json:"mtp_type,omitempty"`
	// Imatrix is the imatrix parameter as written; ImatrixStage is set
	// when it names a stage, ImatrixDigest when it is a file (its
	// digest when the pipeline was loaded).
	Imatrix        string   `json:"imatrix,omitempty"`
	ImatrixStage   bool     `json:"imatrix_stage,omitempty"`
	ImatrixDigest  string   `json:"imatrix_digest,omitempty"`
	IncludeWeights []string `json:"include_weights,omitempty"`
	ExcludeWeights []string `json:"exclude_weights,omitempty"`

	imatrixPath string             // the file, for a path
	opts        []quantize.Options // one per type
}

var _ Stage = (*quantizeStage)(nil)
var _ Planner = (*quantizeStage)(nil)

func newQuantize(p *Params) (Stage, error) {
	s := &quantizeStage{}
	var err error
	if s.From, err = p.Ref("from", true); err != nil {
		return nil, err
	}
	switch {
	case p.Has("type") && p.Has("types"):
		return nil, p.Errorf("types", "give type or types, not both")
	case p.Has("types"):
		if s.Types, err = p.Strings("types", true); err != nil {
			return nil, err
		}
		if len(s.Types) == 0 {
			return nil, p.Errorf("types", "is empty")
		}
	default:
		t, err := p.String("type", true)
		if err != nil {
			return nil, err
		}
		s.Types = []string{t}
	}
	var base quantize.Options
	for _, f := range []struct {
		key string
		dst *string
		to  **quant.Type
	}{{"output_tensor_type", &s.OutputType, &base.OutputType}, {"token_embedding_type", &s.TokenEmbdType, &base.TokenEmbdType},
		{"mtp_type", &s.MTPType, &base.MTPType}} {
		if *f.dst, err = p.String(f.key, false); err != nil {
			return nil, err
		}
		if *f.dst == "" {
			continue
		}
		t, err := quantize.ParseTensorTypeName(*f.dst)
		if err != nil {
			return nil, p.Errorf(f.key, "%v", err)
		}
		*f.dst, *f.to = t.String(), &t
	}
	if base.TensorTypes, err = tensorTypes(p, "tensor_types"); err != nil {
		return nil, err
	}
	for _, tt := range base.TensorTypes {
		s.TensorTypes = append(s.TensorTypes, [2]string{tt.Pattern, tt.Type.String()})
	}
	if err := s.parseImatrix(p); err != nil {
		return nil, err
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{"leave_output_tensor", &s.LeaveOutput}, {"pure", &s.Pure}, {"allow_requantize", &s.AllowRequantize}} {
		if *b.dst, err = p.Bool(b.key, false); err != nil {
			return nil, err
		}
	}
	base.LeaveOutput, base.Pure, base.AllowRequantize = s.LeaveOutput, s.Pure, s.AllowRequantize
	seen := map[quant.FileType]bool{}
	for i, name := range s.Types {
		ft, err := quantize.ParseType(name)
		if err != nil {
			return nil, p.Errorf("types", "%v", err)
		}
		if seen[ft] {
			return nil, p.Errorf("types", "%s twice", ft)
		}
		if ft == quant.FileQ2_K_S && s.Imatrix == "" {
			return nil, p.Errorf("types", "%s needs an importance matrix (imatrix: STAGE_OR_PATH)", ft)
		}
		seen[ft] = true
		s.Types[i] = ft.String() // canonical: q4_k and Q4_K_M are one stage key
		o := base
		o.FileType = ft
		s.opts = append(s.opts, o)
	}
	return s, nil
}

func (s *quantizeStage) Params() any { return s }

// tensorTypes reads a mapping { REGEX: TYPE } in the order written.
func tensorTypes(p *Params, key string) ([]quant.TensorType, error) {
	n, err := p.node(key, false)
	if n == nil || err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		return nil, p.Errorf(key, "must be a mapping { REGEX: TYPE, … }")
	}
	var out []quant.TensorType
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || v.Kind != yaml.ScalarNode {
			return nil, p.errAt(k.Line, "%s.%s: every entry must be REGEX: TYPE", p.kind, key)
		}
		tt, err := quantize.NewTensorType(k.Value, v.Value)
		if err != nil {
			return nil, p.errAt(k.Line, "%s.%s: %v", p.kind, key, err)
		}
		out = append(out, tt)
	}
	return out, nil
}

// parseImatrix reads imatrix, include_weights and exclude_weights. A
// path's file is read now: its digest goes into the stage key.
func (s *quantizeStage) parseImatrix(p *Params) error {
	v, err := p.String("imatrix", false)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		key string
		dst *[]string
	}{{"include_weights", &s.IncludeWeights}, {"exclude_weights", &s.ExcludeWeights}} {
		if p.Has(f.key) {
			if *f.dst, err = p.Strings(f.key, true); err != nil {
				return err
			}
		}
	}
	switch {
	case len(s.IncludeWeights) > 0 && len(s.ExcludeWeights) > 0:
		return p.Errorf("include_weights", "include_weights and exclude_weights cannot be used together")
	case v == "" && len(s.IncludeWeights)+len(s.ExcludeWeights) > 0:
		return p.Errorf("imatrix", "include_weights and exclude_weights filter an importance matrix; no imatrix given")
	case v == "":
		return nil
	}
	s.Imatrix = v
	if !strings.ContainsRune(v, '/') && !strings.HasPrefix(v, "~") && !strings.HasSuffix(v, ".gguf") && !strings.HasSuffix(v, ".dat") {
		s.ImatrixStage = true
		_, err := p.Ref("imatrix", true)
		return err
	}
	if s.imatrixPath, err = p.Path("imatrix", true); err != nil {
		return err
	}
	if _, err := imatrix.Open(s.imatrixPath); err != nil {
		return p.Errorf("imatrix", "%v", err)
	}
	d, _, err := manifest.HashFile(s.imatrixPath)
	if err != nil {
		return p.Errorf("imatrix", "%v", err)
	}
	s.ImatrixDigest = d.String()
	return nil
}

// matrix opens the importance matrix (nil for none), filtered, and says
// the name quantize.imatrix.file gets.
func (s *quantizeStage) matrix(env *Env) (*imatrix.Matrix, string, error) {
	var path, name string
	switch {
	case s.Imatrix == "":
		return nil, "", nil
	case s.ImatrixStage:
		in := env.Input(s.Imatrix)
		if in == nil {
			return nil, "", fmt.Errorf("quantize: imatrix input %q not given", s.Imatrix)
		}
		rel, err := matrixFile(in)
		if err != nil {
			return nil, "", err
		}
		path, name = filepath.Join(in.Dir, rel), filepath.Base(rel)
	default:
		d, _, err := manifest.HashFile(s.imatrixPath)
		if err != nil {
			return nil, "", fmt.Errorf("quantize: imatrix: %w", err)
		}
		if d.String() != s.ImatrixDigest {
			return nil, "", fmt.Errorf("quantize: imatrix %s changed since the pipeline file was read (digest %s, then %s): run again", s.imatrixPath, d, s.ImatrixDigest)
		}
		path, name = s.imatrixPath, s.Imatrix
	}
	m, err := imatrix.Open(path)
	if err != nil {
		return nil, "", err
	}
	if len(s.ExcludeWeights) > 0 {
		m = m.Exclude(s.ExcludeWeights)
	}
	if len(s.IncludeWeights) > 0 {
		m = m.Include(s.IncludeWeights)
	}
	return m, name, nil
}

// matrixFile is the importance matrix among a stage's outputs: its one
// file, or its one .gguf or .dat file.
func matrixFile(in *Input) (string, error) {
	var all, found []string
	for _, o := range in.Outputs {
		all = append(all, o.Path)
	}
	if in.Outputs == nil { // a planning preview: list the directory
		ents, _ := os.ReadDir(in.Dir)
		for _, e := range ents {
			if !e.IsDir() {
				all = append(all, e.Name())
			}
		}
	}
	if len(all) == 1 {
		return all[0], nil
	}
	for _, p := range all {
		if strings.HasSuffix(p, ".gguf") || strings.HasSuffix(p, ".dat") {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("quantize: imatrix stage %s holds %d files (%d .gguf or .dat: %s); want one importance matrix", in.Stage, len(all), len(found), strings.Join(found, ", "))
	}
	return found[0], nil
}

// input finds the one .gguf file of the from stage's view.
func (s *quantizeStage) input(env *Env) (string, error) {
	in := env.Input(s.From)
	if in == nil {
		return "", fmt.Errorf("quantize: input %q not given", s.From)
	}
	var found []string
	for _, o := range in.Outputs {
		if strings.HasSuffix(o.Path, ".gguf") {
			found = append(found, o.Path)
		}
	}
	if in.Outputs == nil { // a planning preview: list the directory
		m, _ := filepath.Glob(filepath.Join(in.Dir, "*.gguf"))
		for _, p := range m {
			found = append(found, filepath.Base(p))
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("quantize: stage %s holds %d .gguf files (%s); want exactly one", s.From, len(found), strings.Join(found, ", "))
	}
	return filepath.Join(in.Dir, found[0]), nil
}

// outName is the output file for type ft of input file in: its type
// suffix (-F16, -BF16, -F32) replaced, or the type appended.
func outName(in string, ft quant.FileType) string {
	base := strings.TrimSuffix(filepath.Base(in), ".gguf")
	for _, suf := range []string{"-F16", "-BF16", "-F32", "-f16", "-bf16", "-f32"} {
		if strings.HasSuffix(base, suf) {
			base = strings.TrimSuffix(base, suf)
			break
		}
	}
	return base + "-" + ft.String() + ".gguf"
}

func (s *quantizeStage) plans(env *Env) (*gguf.File, []*quantize.Plan, error) {
	in, err := s.input(env)
	if err != nil {
		return nil, nil, err
	}
	m, name, err := s.matrix(env)
	if err != nil {
		return nil, nil, err
	}
	f, err := gguf.Open(in)
	if err != nil {
		return nil, nil, err
	}
	var ps []*quantize.Plan
	for _, o := range s.opts {
		o.Imatrix, o.ImatrixFile = m, name
		p, err := quantize.NewPlan(f, o)
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		ps = append(ps, p)
	}
	return f, ps, nil
}

func (s *quantizeStage) Run(ctx context.Context, env *Env) (*Result, error) {
	f, plans, err := s.plans(env)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	// Room for every output is checked before the first is written (a
	// finished one, or a partial file of the same size, is already there).
	var total, need int64
	for _, p := range plans {
		total += p.InputBytes
		need += p.Layout.Size
		name := outName(f.Path, p.FileType)
		for _, q := range []string{filepath.Join(work, name), gguf.PartialPath(filepath.Join(work, name))} {
			if st, err := os.Stat(q); err == nil && st.Size() == p.Layout.Size {
				need -= p.Layout.Size
				break
			}
		}
	}
	if free, ok, err := fsutil.FreeSpace(work); err == nil && ok && free < need {
		return nil, fmt.Errorf("quantize: %w: the outputs need %d bytes, %s has %d free", quantize.ErrNoSpace, need, work, free)
	}
	env.Progress.SetTotal(total)
	res := &Result{}
	for _, p := range plans {
		name := outName(f.Path, p.FileType)
		out := filepath.Join(work, name)
		if st, err := os.Stat(out); err == nil && st.Size() == p.Layout.Size && !exists(out+".journal") {
			// Finished by a killed run before the next output: keep it.
			env.Progress.Add(p.InputBytes)
		} else if _, err := quantize.Run(ctx, f, p, out, quantize.RunOptions{
			Jobs: env.Jobs, Progress: env.Progress.Add, Journal: filepath.Join(work, name+".journal"),
		}); err != nil {
			return nil, err
		}
		d, n, err := env.Store.Adopt(out)
		if err != nil {
			return nil, err
		}
		res.Outputs = append(res.Outputs, manifest.Output{Path: name, Digest: d, Size: n})
	}
	return res, nil
}

// Plan plans every type from the input's header (no tensor data): a type
// the file's tensors do not allow, an input that is truncated, quantized
// (without allow_requantize) or promises NextN layers it lacks is refused
// here, before any stage of the run starts.
func (s *quantizeStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	f, plans, err := s.plans(env)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var parts []string
	for _, p := range plans {
		parts = append(parts, fmt.Sprintf("%s %s", outName(f.Path, p.FileType), FormatBytes(p.Layout.Size)))
	}
	// quantize.Run holds about ChunkElems (1Mi) values per worker: the
	// input rows (≤ 4 bytes a value), their float32s and the blocks.
	summary := fmt.Sprintf("%s (%s) → %s", filepath.Base(f.Path), f.Architecture(), strings.Join(parts, ", "))
	if o := plans[0].Options; o.Imatrix != nil {
		summary += fmt.Sprintf(", imatrix %s (%d entries; %d quantized tensors without one)", o.ImatrixFile, o.Imatrix.Len(), len(plans[0].Unweighted))
	}
	return &StagePlan{
		Summary: summary,
		Memory:  int64(max(env.Jobs, 1))*(1<<20)*10 + 64<<20,
	}, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }
