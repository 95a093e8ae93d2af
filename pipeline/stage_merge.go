package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/merge"
)

// mergeStage merges a PEFT LoRA/DoRA/rsLoRA adapter into a base checkpoint
// with the merge package (PEFT merge_and_unload semantics, streaming).
//
//	merge: { base: base, adapter: adapter, dtype: bf16, allow_unused: false, allow_nonfinite: false }
//
// base and adapter name earlier stages (usually imports); dtype (bf16, f16,
// f32) is the merged tensors' dtype, default each base tensor's own;
// allow_nonfinite merges even where the adapter brings NaN or Inf (enters
// the stage key only when set, so keys of existing pipelines stay). The
// merge writes into the stage's work dir inside the store (merge resumes
// there after a kill, from its own shard journal), and every file is then
// adopted into the blobs by hard link under the digest merge computed while
// writing it.
type mergeStage struct {
	Base        string `json:"base"`
	Adapter     string `json:"adapter"`
	DType       string `json:"dtype,omitempty"`
	AllowUnused bool   `json:"allow_unused,omitempty"`
	// omitempty: absent when false, so stage keys made before the option
	// existed do not change.
	AllowNonFinite bool `json:"allow_nonfinite,omitempty"`
}

var _ Stage = (*mergeStage)(nil)

func newMerge(p *Params) (Stage, error) {
	s := &mergeStage{}
	var err error
	if s.Base, err = p.Ref("base", true); err != nil {
		return nil, err
	}
	if s.Adapter, err = p.Ref("adapter", true); err != nil {
		return nil, err
	}
	dt, err := p.String("dtype", false)
	if err != nil {
		return nil, err
	}
	d, err := merge.ParseDType(dt)
	if err != nil {
		return nil, p.Errorf("dtype", "%v", err)
	}
	s.DType = strings.ToLower(string(d)) // bf16, f16, f32 or "", as keys have always had it
	if s.AllowUnused, err = p.Bool("allow_unused", false); err != nil {
		return nil, err
	}
	if s.AllowNonFinite, err = p.Bool("allow_nonfinite", false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *mergeStage) Params() any { return s }

// inventory makes the merge plan from the inputs' headers and configs.
func (s *mergeStage) inventory(env *Env) (*merge.Plan, error) {
	base, adapter := env.Input(s.Base), env.Input(s.Adapter)
	if base == nil || adapter == nil {
		return nil, fmt.Errorf("merge: inputs %q and %q not given", s.Base, s.Adapter)
	}
	dt, _ := merge.ParseDType(s.DType)
	return merge.Inventory(base.Dir, adapter.Dir, merge.PlanOptions{AllowUnused: s.AllowUnused, DType: dt})
}

func (s *mergeStage) Run(ctx context.Context, env *Env) (*Result, error) {
	plan, err := s.inventory(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	// A work dir holding files but no merge journal is a run killed after
	// its merge finished (the journal goes last), before the record: that
	// merge is not resumable, so it starts afresh.
	if _, err := os.Stat(filepath.Join(work, merge.JournalName)); err != nil {
		if err := os.RemoveAll(work); err != nil {
			return nil, err
		}
		if work, err = env.WorkDir(); err != nil {
			return nil, err
		}
	}
	env.Progress.SetTotal(plan.TotalBytes)
	var last int64
	res, err := merge.Execute(ctx, plan, work, merge.ExecOptions{
		Jobs:           env.Jobs,
		AllowNonFinite: s.AllowNonFinite,
		Progress: func(done, total int64) {
			env.Progress.Add(done - last)
			last = done
		},
		// Each shard is a blob as soon as it is whole: in a run that
		// shares the merge, it is stored while the others are written.
		ShardDone: func(f merge.FileDigest) error {
			d, err := f.Digest()
			if err != nil {
				return fmt.Errorf("merge output %s: %w", f.Name, err)
			}
			_, _, err = env.AdoptKnown(filepath.Join(work, filepath.FromSlash(f.Name)), d, f.Size)
			if err == nil && mergeShardDone != nil {
				mergeShardDone(f.Name)
			}
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	out := &Result{}
	for _, f := range res.Files {
		d, err := f.Digest()
		if err != nil {
			return nil, fmt.Errorf("merge output %s: %w", f.Name, err)
		}
		if _, _, err := env.AdoptKnown(filepath.Join(work, filepath.FromSlash(f.Name)), d, f.Size); err != nil {
			return nil, err
		}
		out.Outputs = append(out.Outputs, manifest.Output{Path: filepath.ToSlash(f.Name), Digest: d, Size: f.Size})
	}
	return out, nil
}

// mergeShardDone, set by tests only, is told of each shard the merge
// made a blob, while it writes the others.
var mergeShardDone func(name string)

// Plan makes the merge plan from the base's and adapter's headers and
// configs (no tensor data): a missing target, an adapter that does not fit
// the base or unused adapter tensors are refused here, before any stage
// of the run starts.
func (s *mergeStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	plan, err := s.inventory(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	// Each worker, and the writer, hold a block of whole rows (at least
	// merge.DefaultBlockElems elements) at about 16 bytes an element (the
	// raw bytes, the base and delta rows in float32, the output); one
	// module's A and B factors in float32; and a constant.
	var width, factors int64
	for _, m := range plan.Modules {
		width = max(width, m.Cols)
		factors = max(factors, (m.Rows+m.Cols)*int64(m.Rank)*4)
	}
	block := max(width, merge.DefaultBlockElems) * 16
	return &StagePlan{
		Summary: fmt.Sprintf("%d modules into %d shards, %s", len(plan.Modules), len(plan.Shards), FormatBytes(plan.TotalBytes)),
		Memory:  int64(max(env.Jobs, 1)+1)*block + 2*factors + 64<<20,
	}, nil
}
