package pipeline

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/safetensors"
)

// ggufStage converts a safetensors checkpoint stage to one GGUF file with
// gguf/convert (convert_hf_to_gguf.py semantics).
//
//	gguf: { from: merged, outtype: f16, model_name: Jarvis2-27B, no_mtp: false, mtp_only: false, pre: qwen2, mmproj: auto }
//
// mmproj (auto, true, false: mmproj.go) also writes the vision tower of a
// vision-language checkpoint as mmproj-<model_name>-<TYPE>.gguf, a second
// output, in the stage's outtype as the converter's --mmproj --outtype.
//
// outtype is f16 (default), bf16, f32, q8_0 or auto. split_max_size:
// 50G (N(M|G), M = 1000000 bytes, G = 1000000000, as llama-gguf-split
// counts) or split_max_tensors: N writes the file as the parts
// llama-gguf-split --split makes of it (NAME-00001-of-0000N.gguf …), each
// an output, byte for byte; Hugging Face takes files up to 50 GB. Like
// convert_hf_to_gguf.py, general.name and friends come from the model
// directory's name; the stage converts from a directory named model_name
// (default: the from stage's name), so the output does not depend on where
// views live.
//
// Resume: convert.Run, which `ferry gguf convert` calls too, keeps
// <file>.partial and <file>.journal in the stage's work dir; the journal
// records finished tensors only after the partial file has been fsynced, so
// a killed run rewrites only tensors that were not durable.
type ggufStage struct {
	From      string `json:"from"`
	OutType   string `json:"outtype"`
	ModelName string `json:"model_name"`
	NoMTP     bool   `json:"no_mtp,omitempty"`
	MTPOnly   bool   `json:"mtp_only,omitempty"`
	Pre       string `json:"pre,omitempty"`
	MMProj    string `json:"mmproj,omitempty"` // "", auto or true (mmproj.go)
	// SplitMaxSize and SplitMaxTensors are split_max_size and
	// split_max_tensors (splitParams): the text GGUF is written as its
	// llama-gguf-split parts, every one an output (the mmproj whole).
	SplitMaxSize    string `json:"split_max_size,omitempty"`
	SplitMaxTensors int    `json:"split_max_tensors,omitempty"`

	split gguf.SplitOptions
}

var _ Stage = (*ggufStage)(nil)

func newGGUF(p *Params) (Stage, error) {
	s := &ggufStage{}
	var err error
	if s.From, err = p.Ref("from", true); err != nil {
		return nil, err
	}
	if s.OutType, err = p.String("outtype", false); err != nil {
		return nil, err
	}
	o, err := convert.ParseOutType(s.OutType)
	if err != nil {
		return nil, p.Errorf("outtype", "%v", err)
	}
	s.OutType = string(o)
	if s.ModelName, err = p.String("model_name", false); err != nil {
		return nil, err
	}
	if s.ModelName == "" {
		s.ModelName = s.From
	}
	if strings.ContainsAny(s.ModelName, `/\`) || s.ModelName == "." || s.ModelName == ".." {
		return nil, p.Errorf("model_name", "must be a plain name, got %q", s.ModelName)
	}
	if s.NoMTP, err = p.Bool("no_mtp", false); err != nil {
		return nil, err
	}
	if s.MTPOnly, err = p.Bool("mtp_only", false); err != nil {
		return nil, err
	}
	if s.NoMTP && s.MTPOnly {
		return nil, p.Errorf("mtp_only", "no_mtp and mtp_only exclude each other")
	}
	if s.Pre, err = p.String("pre", false); err != nil {
		return nil, err
	}
	if s.MMProj, err = parseMMProj(p); err != nil {
		return nil, err
	}
	if s.MMProj != mmprojOff && s.MTPOnly {
		return nil, p.Errorf("mmproj", "an mtp_only stage writes the MTP head alone; its mmproj belongs to a full conversion")
	}
	if s.split, s.SplitMaxSize, err = splitParams(p); err != nil {
		return nil, err
	}
	s.SplitMaxTensors = s.split.MaxTensors
	return s, nil
}

func (s *ggufStage) Params() any { return s }

func (s *ggufStage) Run(ctx context.Context, env *Env) (*Result, error) {
	in := env.Input(s.From)
	if in == nil {
		return nil, fmt.Errorf("gguf: input %q not given", s.From)
	}
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(work, "src", s.ModelName)
	if err := env.ViewOf(in, src); err != nil {
		return nil, err
	}
	ck, plan, err := s.plan(src)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	for _, w := range plan.Warnings {
		env.Log.Warn("gguf: " + w)
	}
	name := plan.DefaultFileName(s.MTPOnly)
	out := filepath.Join(work, name)
	mck, mplan, err := mmprojPlan(src, s.MMProj, convert.OutType(s.OutType))
	if err != nil {
		return nil, err
	}
	if mck != nil {
		defer mck.Close()
	}
	total := plan.InputBytes
	if mplan != nil {
		total += mplan.InputBytes
	}
	env.Progress.SetTotal(total)

	// The journal lives beside the output in the work dir, which the
	// runner keeps across killed runs and removes after the commit.
	res, err := convert.Run(ctx, ck, plan, out, convert.RunOptions{
		Jobs: env.Jobs, Progress: env.Progress.Add, Digest: true, Cores: env.Cores,
		Journal: filepath.Join(work, name+".journal"),
	})
	if err != nil {
		return nil, err
	}
	// Hashed while written: adopted without reading them again. A split
	// is every part, first to last.
	var outs []manifest.Output
	for _, f := range res.Files {
		d, n, err := env.AdoptKnown(f.Path, manifest.NewDigest(f.Digest[:]), f.Size)
		if err != nil {
			return nil, err
		}
		outs = append(outs, manifest.Output{Path: filepath.Base(f.Path), Digest: d, Size: n})
	}
	if mplan != nil {
		o, err := writeMMProj(ctx, env, work, mck, mplan)
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
	}
	return &Result{Outputs: outs}, nil
}

// Plan makes the conversion plan from the input's headers, config and
// tokenizer files (no tensor data): an unsupported architecture or an
// option the checkpoint does not allow is refused here, before any stage
// of the run starts.
func (s *ggufStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	in := env.Input(s.From)
	if in == nil {
		return nil, fmt.Errorf("gguf: input %q not given", s.From)
	}
	ck, plan, err := s.plan(in.Dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	mck, mplan, err := mmprojPlan(in.Dir, s.MMProj, convert.OutType(s.OutType))
	if err != nil {
		return nil, err
	}
	if mck != nil {
		mck.Close()
	}
	// convert.Write holds about ChunkElems (1Mi) elements per worker at
	// 8 bytes each (16 from F64), plus the writer's and hasher's buffers.
	return &StagePlan{
		Summary:     fmt.Sprintf("%s → %s (%s), %d tensors, %s%s%s", plan.HFArch, plan.Arch, plan.OutType, len(plan.Tensors), FormatBytes(plan.Layout.OutputSize()), splitNote(plan.Layout), mmprojSummary(s.MMProj, mplan)),
		Memory:      int64(max(env.Jobs, 1))*(1<<20)*16 + 64<<20,
		OutputBytes: plan.Layout.OutputSize(),
	}, nil
}

// plan opens the checkpoint in dir (headers only) and makes the conversion
// plan; the caller closes the checkpoint.
func (s *ggufStage) plan(dir string) (*safetensors.Checkpoint, *convert.Plan, error) {
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, err
	}
	plan, err := convert.NewPlan(ck, convert.Options{
		OutType: convert.OutType(s.OutType), NoMTP: s.NoMTP, MTPOnly: s.MTPOnly, Pre: s.Pre, Split: s.split,
	})
	if err != nil {
		ck.Close()
		return nil, nil, err
	}
	return ck, plan, nil
}
