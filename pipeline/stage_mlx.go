package pipeline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/mlxpack"
)

// mlxRepackStage turns a compressed-tensors (pack-quantized) checkpoint
// into an MLX one with mlxpack, without requantizing.
//
//	mlx_repack: { from: ct, rewrite: false }
//
// Every file the repack links to the source is recorded as the source's
// blob (no byte moves, the view is a symlink farm into the same blobs);
// the files it writes (config.json, and with rewrite: true the rewritten
// shards and index) are hashed into the store.
type mlxRepackStage struct {
	From    string `json:"from"`
	Rewrite bool   `json:"rewrite,omitempty"`
}

var _ Stage = (*mlxRepackStage)(nil)

func newMLXRepack(p *Params) (Stage, error) {
	s := &mlxRepackStage{}
	var err error
	if s.From, err = p.Ref("from", true); err != nil {
		return nil, err
	}
	if s.Rewrite, err = p.Bool("rewrite", false); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *mlxRepackStage) Params() any { return s }

// plan makes the repack plan of the input; Close it.
func (s *mlxRepackStage) plan(env *Env) (*Input, *mlxpack.Plan, error) {
	return mlxPlan(env, "mlx_repack", s.From, func(src string) (*mlxpack.Plan, error) {
		return mlxpack.PlanRepack(src, mlxpack.Options{Rewrite: s.Rewrite, Relative: true, Jobs: env.Jobs})
	})
}

func (s *mlxRepackStage) Run(ctx context.Context, env *Env) (*Result, error) {
	in, plan, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	byPath := map[string]manifest.Output{}
	for _, o := range in.Outputs {
		byPath[o.Path] = o
	}
	dst, err := mlxOut(env) // a repack is cheap: it starts clean
	if err != nil {
		return nil, err
	}
	res, err := mlxpack.Repack(ctx, plan, dst)
	if err != nil {
		return nil, err
	}
	out := &Result{}
	for _, e := range plan.Entries {
		if e.Kind == mlxpack.EntryLink {
			rel, err := filepath.Rel(plan.Src, e.Source)
			if err != nil {
				return nil, err
			}
			o, ok := byPath[filepath.ToSlash(rel)]
			if !ok {
				return nil, fmt.Errorf("mlx_repack: %s links to %s, which is not an output of %s", e.Name, e.Source, s.From)
			}
			out.Outputs = append(out.Outputs, manifest.Output{Path: filepath.ToSlash(e.Name), Digest: o.Digest, Size: o.Size})
			continue
		}
		o, err := adoptOutput(env, dst, e.Name, nil)
		if err != nil {
			return nil, err
		}
		out.Outputs = append(out.Outputs, o)
	}
	env.Log.Debug("mlx repack", "mode", res.Mode, "packed_modules", res.PackedModules)
	return out, nil
}

// Plan makes the repack plan from the input's headers and config (no
// tensor data): a checkpoint that is not compressed-tensors pack-quantized
// is refused here, before any stage of the run starts.
func (s *mlxRepackStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	_, plan, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	return &StagePlan{Summary: fmt.Sprintf("%d entries", len(plan.Entries)), Memory: 64 << 20}, nil
}

// The two mlx stages start and end alike: the input directory, then the
// output directory work/mlx, written whole and adopted into the store.

// mlxPlan plans an mlx stage (kind, in messages) from the absolute
// directory of its input from stage from.
func mlxPlan[P any](env *Env, kind, from string, plan func(src string) (P, error)) (*Input, P, error) {
	var none P
	in := env.Input(from)
	if in == nil {
		return nil, none, fmt.Errorf("%s: input %q not given", kind, from)
	}
	src, err := filepath.Abs(in.Dir)
	if err != nil {
		return nil, none, err
	}
	p, err := plan(src)
	if err != nil {
		return nil, none, err
	}
	return in, p, nil
}

// mlxOut is the directory an mlx stage writes: work/mlx, removed if a run
// killed before its record was made left it whole (it is written again;
// a conversion resumes from its own partial directory beside it).
func mlxOut(env *Env) (string, error) {
	work, err := env.WorkDir()
	if err != nil {
		return "", err
	}
	dst := filepath.Join(work, "mlx")
	return dst, os.RemoveAll(dst)
}

// adoptOutput makes the file name (slash-separated) of dir the stage's
// output of that name in the store: under the digest its writer computed
// (sum), or hashed here when there is none.
func adoptOutput(env *Env, dir, name string, sum *mlxpack.FileSum) (manifest.Output, error) {
	p := filepath.Join(dir, filepath.FromSlash(name))
	var d manifest.Digest
	var n int64
	var err error
	if sum == nil {
		d, n, err = env.AdoptFile(p)
	} else {
		d, n, err = env.AdoptKnown(p, manifest.NewDigest(sum.SHA256), sum.Size)
	}
	if err != nil {
		return manifest.Output{}, err
	}
	return manifest.Output{Path: filepath.ToSlash(name), Digest: d, Size: n}, nil
}
