package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/gguf/quantize"
	"github.com/ferry-llm/ferry/internal/fsutil"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"
)

// quantizeStage quantizes the GGUF file of a stage (a gguf stage's
// output), or the safetensors checkpoint of one (an import or a merge:
// converted on the fly as the gguf stage with outtype f16 would, never
// written), with gguf/quantize, byte-identical to llama-quantize.
//
//	quantize: { from: f16, type: Q4_K_M }
//	quantize: { from: merged, types: [Q6_K, Q4_K_M], report: true }
//
// type (one) or types (several, each its own output file, all made from
// one read of the input) is a llama-quantize type name, checked when the
// pipeline file is parsed. output_tensor_type,
// token_embedding_type, leave_output_tensor, pure and allow_requantize
// are llama-quantize's options of those names; tensor_types is its
// --tensor-type, a mapping { REGEX: TYPE } tried in the order written
// (the first match wins); mtp_type is `ferry quantize --mtp-type`. no_mtp
// drops a checkpoint's mtp.* tensors (as the gguf stage's). The from
// stage must hold exactly one .gguf file, or a checkpoint (config.json
// and its shards); each output is named after the GGUF file with its type
// (Jarvis2-27B-F16.gguf → Jarvis2-27B-Q4_K_M.gguf), or after the from
// stage for a checkpoint (merged-Q4_K_M.gguf). model_name, for a
// checkpoint, is the gguf stage's model_name: the outputs are then the
// bytes and names a gguf stage with that model_name (outtype f16)
// followed by this stage would make, without the F16 file, so the
// K-quants need not wait for it:
//
//	quantize: { from: merged, model_name: Jarvis2-27B, types: [Q6_K, Q4_K_M] }
//
// mmproj (auto, true, false; mmproj.go), for a checkpoint input, also
// writes its vision tower as the gguf stage with that model_name does
// (mmproj-<model_name>-F16.gguf, the same bytes), beside the quants: the
// folder llama.cpp and LM Studio look for it in. A from stage holding a
// text GGUF and an mmproj (a gguf stage with mmproj) quantizes the text
// GGUF.
//
// report: true adds the
// quality report of the outputs, measured while quantizing, as
// <name>-report.parquet and <name>-report.svg
// (quantize.WriteReportParquet, WriteReportSVG).
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
// split_max_size: 50G or split_max_tensors: N writes each output as the
// parts llama-gguf-split --split makes of it (as the gguf stage's), each
// an output; a from stage holding a split is read through its first part.
//
// Resume: quantize.RunMulti, which `ferry quantize` calls too, keeps
// <file>.partial and <file>.journal for each output in the stage's work
// dir; each journal records finished tensors after its partial file has
// been fsynced, so a killed run rewrites only the tensors that were not
// durable (and an output already finished is kept, unless the report
// needs its errors measured again).
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
	NoMTP          bool     `json:"no_mtp,omitempty"`
	Report         bool     `json:"report,omitempty"`
	// ModelName is model_name, for a checkpoint input: the name the gguf
	// stage's model_name is (the directory name the converter reads).
	ModelName string `json:"model_name,omitempty"`
	// MMProj is mmproj: "", auto or true (mmproj.go).
	MMProj string `json:"mmproj,omitempty"`
	// SplitMaxSize and SplitMaxTensors are split_max_size and
	// split_max_tensors (splitParams): each output is written as its
	// llama-gguf-split parts, every one an output.
	SplitMaxSize    string `json:"split_max_size,omitempty"`
	SplitMaxTensors int    `json:"split_max_tensors,omitempty"`

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
	if s.ModelName, err = p.String("model_name", false); err != nil {
		return nil, err
	}
	if strings.ContainsAny(s.ModelName, `/\`) || s.ModelName == "." || s.ModelName == ".." {
		return nil, p.Errorf("model_name", "must be a plain name, got %q", s.ModelName)
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{"leave_output_tensor", &s.LeaveOutput}, {"pure", &s.Pure}, {"allow_requantize", &s.AllowRequantize}, {"no_mtp", &s.NoMTP}, {"report", &s.Report}} {
		if *b.dst, err = p.Bool(b.key, false); err != nil {
			return nil, err
		}
	}
	if s.MMProj, err = parseMMProj(p); err != nil {
		return nil, err
	}
	base.LeaveOutput, base.Pure, base.AllowRequantize = s.LeaveOutput, s.Pure, s.AllowRequantize
	if base.Split, s.SplitMaxSize, err = splitParams(p); err != nil {
		return nil, err
	}
	s.SplitMaxTensors = base.Split.MaxTensors
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

// input finds the from stage's one .gguf file, or its checkpoint
// directory, and the stem its outputs are named after (for a checkpoint
// with model_name, the stem is known once the source is open: ""). A
// checkpoint with model_name is read through a directory of that name:
// a view in work, or for a planning preview (work "") a link to the
// input in a temporary directory that done removes.
func (s *quantizeStage) input(env *Env, work string) (path, stem string, done func(), err error) {
	done = func() {}
	in := env.Input(s.From)
	if in == nil {
		return "", "", done, fmt.Errorf("quantize: input %q not given", s.From)
	}
	var found []string
	checkpoint := false
	for _, o := range in.Outputs {
		// A split is its first part (the quantizer reads every part).
		if strings.HasSuffix(o.Path, ".gguf") && !laterSplitPart(o.Path) {
			found = append(found, o.Path)
		}
		checkpoint = checkpoint || o.Path == "config.json"
	}
	if in.Outputs == nil { // a planning preview: list the directory
		m, _ := filepath.Glob(filepath.Join(in.Dir, "*.gguf"))
		for _, p := range m {
			if !laterSplitPart(p) {
				found = append(found, filepath.Base(p))
			}
		}
		checkpoint = exists(filepath.Join(in.Dir, "config.json"))
	}
	// A gguf stage with mmproj holds the text GGUF and its mmproj: the
	// text GGUF is the one to quantize.
	if text := slices.DeleteFunc(slices.Clone(found), func(n string) bool { return strings.HasPrefix(n, "mmproj-") }); len(found) > 1 && len(text) == 1 {
		found = text
	}
	if s.MMProj != mmprojOff && len(found) > 0 {
		return "", "", done, fmt.Errorf("quantize: mmproj writes a checkpoint's vision tower; stage %s holds a GGUF file (%s): give the gguf stage that makes it mmproj instead", s.From, strings.Join(found, ", "))
	}
	switch {
	case len(found) == 1 && s.ModelName != "":
		return "", "", done, fmt.Errorf("quantize: model_name %q names the model a checkpoint is converted as; stage %s holds a GGUF file (%s), whose name it keeps", s.ModelName, s.From, found[0])
	case len(found) == 1:
		return filepath.Join(in.Dir, found[0]), quantize.Stem(found[0]), done, nil
	case len(found) == 0 && checkpoint && s.ModelName == "":
		return in.Dir, s.From, done, nil
	case len(found) == 0 && checkpoint && work != "" && in.Outputs != nil:
		view := filepath.Join(work, "src", s.ModelName)
		if err := env.ViewOf(in, view); err != nil {
			return "", "", done, err
		}
		return view, "", done, nil
	case len(found) == 0 && checkpoint:
		tmp, err := os.MkdirTemp("", "ferry-quantize-plan-")
		if err != nil {
			return "", "", done, err
		}
		done = func() { os.RemoveAll(tmp) }
		abs, err := filepath.Abs(in.Dir)
		if err == nil {
			err = os.Symlink(abs, filepath.Join(tmp, s.ModelName))
		}
		if err != nil {
			done()
			return "", "", func() {}, err
		}
		return filepath.Join(tmp, s.ModelName), "", done, nil
	}
	return "", "", done, fmt.Errorf("quantize: stage %s holds %d .gguf files (%s); want exactly one, or a checkpoint (config.json and its shards)", s.From, len(found), strings.Join(found, ", "))
}

// quantizePlans is what plans makes: the source, an output per type
// named after stem, and the checkpoint's mmproj to write (mck and mplan
// nil when there is none).
type quantizePlans struct {
	src   *quantize.Source
	outs  []quantize.Output
	stem  string
	mck   *safetensors.Checkpoint
	mplan *convert.Plan
}

func (q *quantizePlans) Close() {
	q.src.Close()
	if q.mck != nil {
		q.mck.Close()
	}
}

// plans opens the input and plans every type, and the mmproj: the
// outputs, named in dir.
func (s *quantizeStage) plans(env *Env, dir string) (*quantizePlans, error) {
	in, stem, done, err := s.input(env, dir)
	if err != nil {
		return nil, err
	}
	// A preview's link goes once the headers are read: Plan reads no
	// tensor data.
	defer done()
	q := &quantizePlans{}
	if q.mck, q.mplan, err = mmprojPlan(in, s.MMProj, convert.OutF16); err != nil {
		return nil, err
	}
	q.src, q.outs, q.stem, err = s.typePlans(env, in, stem, dir)
	if err != nil {
		if q.mck != nil {
			q.mck.Close()
		}
		return nil, err
	}
	return q, nil
}

// typePlans plans every type of the input at in.
func (s *quantizeStage) typePlans(env *Env, in, stem, dir string) (src *quantize.Source, outs []quantize.Output, _ string, err error) {
	m, mname, err := s.matrix(env)
	if err != nil {
		return nil, nil, "", err
	}
	if src, err = quantize.OpenSource(in, quantize.SourceOptions{NoMTP: s.NoMTP}); err != nil {
		return nil, nil, "", err
	}
	if stem == "" {
		// The gguf stage's file with this model_name, without its type.
		stem = quantize.Stem(src.Convert.DefaultFileName(false))
	}
	for _, o := range s.opts {
		o.Imatrix, o.ImatrixFile = m, mname
		p, err := src.NewPlan(o)
		if err != nil {
			src.Close()
			return nil, nil, "", err
		}
		name := quantize.OutputName(stem, p.FileType)
		outs = append(outs, quantize.Output{Plan: p, Path: filepath.Join(dir, name), Journal: filepath.Join(dir, name+".journal")})
	}
	return src, outs, stem, nil
}

func (s *quantizeStage) Run(ctx context.Context, env *Env) (*Result, error) {
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	q, err := s.plans(env, work)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	src, outs, stem := q.src, q.outs, q.stem
	pq, svg := stem+"-report.parquet", stem+"-report.svg"
	// An output finished by a killed run (renamed into place, its journal
	// removed) is kept, unless the report needs its errors.
	var todo []quantize.Output
	var need int64
	for _, o := range outs {
		if finished(o) && !exists(o.Journal) && !s.Report {
			continue
		}
		todo = append(todo, o)
		l := o.Plan.Layout
		for k, f := range l.Files(o.Path) {
			size := l.FileLayouts()[k].Size
			if st, err := os.Stat(gguf.PartialPath(f)); err != nil || st.Size() != size {
				need += size
			}
		}
	}
	// Room for every output is checked before the first is written.
	if free, ok, err := fsutil.FreeSpace(work); err == nil && ok && free < need {
		return nil, fmt.Errorf("quantize: %w: the outputs need %d bytes, %s has %d free", quantize.ErrNoSpace, need, work, free)
	}
	total := outs[0].Plan.InputBytes
	if q.mplan != nil {
		total += q.mplan.InputBytes
	}
	env.Progress.SetTotal(total)
	// The digests of the files written here, hashed while they were
	// written: not read again to be adopted (the last thing the stage
	// did, one file after the other on one core, was that pass).
	type written struct {
		sum  []byte
		size int64
	}
	known := map[string]written{}
	mine := map[string]bool{} // the files this run writes
	for _, o := range todo {
		for _, f := range o.Plan.Layout.Files(o.Path) {
			mine[filepath.Base(f)] = true
		}
	}
	if len(todo) == 0 {
		env.Progress.Add(outs[0].Plan.InputBytes)
	} else {
		rrs, err := quantize.RunMulti(ctx, src.File, todo, quantize.RunOptions{Jobs: env.Jobs, Progress: env.Progress.Add, Errors: s.Report, Digests: true, Cores: env.Cores})
		if err != nil {
			return nil, err
		}
		for i, rr := range rrs {
			fls := todo[i].Plan.Layout.FileLayouts()
			for k, f := range rr.Files {
				if k < len(rr.Digests) && k < len(fls) {
					known[filepath.Base(f)] = written{rr.Digests[k], fls[k].Size}
				}
			}
		}
		if s.Report {
			if err := writeReport(outs, rrs, filepath.Join(work, pq), filepath.Join(work, svg)); err != nil {
				return nil, err
			}
		}
	}
	res := &Result{}
	adopt := func(name string) error {
		p := filepath.Join(work, name)
		var d manifest.Digest
		var n int64
		var err error
		switch w, ok := known[name]; {
		case ok:
			d, n, err = env.AdoptKnown(p, manifest.NewDigest(w.sum), w.size)
		case mine[name]:
			err = fmt.Errorf("quantize: internal error: %s was written without its digest", p)
		default:
			// Finished by a killed run, or not a quantized file (the
			// report).
			d, n, err = env.AdoptFile(p)
		}
		if err != nil {
			return err
		}
		res.Outputs = append(res.Outputs, manifest.Output{Path: name, Digest: d, Size: n})
		return nil
	}
	for _, o := range outs {
		for _, f := range o.Plan.Layout.Files(o.Path) { // every part of a split
			if err := adopt(filepath.Base(f)); err != nil {
				return nil, err
			}
		}
	}
	if s.Report {
		for _, name := range []string{pq, svg} {
			if err := adopt(name); err != nil {
				return nil, err
			}
		}
	}
	if q.mplan != nil {
		o, err := writeMMProj(ctx, env, work, q.mck, q.mplan)
		if err != nil {
			return nil, err
		}
		res.Outputs = append(res.Outputs, o)
	}
	return res, nil
}

// writeReport writes the report of outs (every output was run: rrs in
// their order) to the files pq and svg.
func writeReport(outs []quantize.Output, rrs []*quantize.RunResult, pq, svg string) error {
	var reps []quantize.OutputReport
	for k := range outs {
		r, err := quantize.NewOutputReport(outs[k], rrs[k])
		if err != nil {
			return err
		}
		reps = append(reps, r)
	}
	if err := quantize.WriteReportParquet(pq, reps, "ferry pipeline"); err != nil {
		return err
	}
	return quantize.WriteReportSVG(svg, reps)
}

// Plan plans every type from the input's header (no tensor data): a type
// the file's tensors do not allow, an input that is truncated, quantized
// (without allow_requantize) or promises NextN layers it lacks is refused
// here, before any stage of the run starts.
func (s *quantizeStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	q, err := s.plans(env, "")
	if err != nil {
		return nil, err
	}
	defer q.Close()
	src, outs := q.src, q.outs
	var parts []string
	var outBytes int64
	for _, o := range outs {
		outBytes += o.Plan.Layout.OutputSize()
		parts = append(parts, fmt.Sprintf("%s %s%s", filepath.Base(o.Path), FormatBytes(o.Plan.Layout.OutputSize()), splitNote(o.Plan.Layout)))
	}
	if s.Report {
		parts = append(parts, "report")
	}
	if q.mplan != nil || s.MMProj == mmprojAuto {
		parts[len(parts)-1] += mmprojSummary(s.MMProj, q.mplan)
	}
	// quantize.RunMulti holds about ChunkElems (1Mi) values per worker:
	// the input rows (≤ 4 bytes a value), their float32s and the blocks of
	// every output (and, converting a checkpoint, the converter's rows),
	// and a 1 MiB buffer per output for the reader hashing it.
	summary := fmt.Sprintf("%s (%s) → %s", filepath.Base(src.Path), src.Architecture(), strings.Join(parts, ", "))
	if o := outs[0].Plan.Options; o.Imatrix != nil {
		summary += fmt.Sprintf(", imatrix %s (%d entries; %d quantized tensors without one)", o.ImatrixFile, o.Imatrix.Len(), len(outs[0].Plan.Unweighted))
	}
	return &StagePlan{
		Summary:     summary,
		Memory:      int64(max(env.Jobs, 1))*(1<<20)*int64(10+2*len(outs)) + int64(len(outs))<<20 + 64<<20,
		OutputBytes: outBytes,
	}, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// finished reports whether o's file, or every part of its split, is in
// place with its planned size (a killed run's finished output).
func finished(o quantize.Output) bool {
	l := o.Plan.Layout
	for k, f := range l.Files(o.Path) {
		if st, err := os.Stat(f); err != nil || st.Size() != l.FileLayouts()[k].Size {
			return false
		}
	}
	return true
}
