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

func (s *mlxRepackStage) Run(ctx context.Context, env *Env) (*Result, error) {
	in := env.Input(s.From)
	if in == nil {
		return nil, fmt.Errorf("mlx_repack: input %q not given", s.From)
	}
	src, err := filepath.Abs(in.Dir)
	if err != nil {
		return nil, err
	}
	byPath := map[string]manifest.Output{}
	for _, o := range in.Outputs {
		byPath[o.Path] = o
	}
	plan, err := mlxpack.PlanRepack(src, mlxpack.Options{Rewrite: s.Rewrite, Relative: true, Jobs: env.Jobs})
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	work, err := env.WorkDir()
	if err != nil {
		return nil, err
	}
	dst := filepath.Join(work, "mlx")
	if err := os.RemoveAll(dst); err != nil { // a repack is cheap: start clean
		return nil, err
	}
	res, err := mlxpack.Repack(ctx, plan, dst)
	if err != nil {
		return nil, err
	}
	out := &Result{}
	for _, e := range plan.Entries {
		p := filepath.Join(dst, filepath.FromSlash(e.Name))
		if e.Kind == "link" {
			rel, err := filepath.Rel(src, e.Source)
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
		d, n, err := env.Store.Adopt(p)
		if err != nil {
			return nil, err
		}
		out.Outputs = append(out.Outputs, manifest.Output{Path: filepath.ToSlash(e.Name), Digest: d, Size: n})
	}
	env.Log.Debug("mlx repack", "mode", res.Mode, "packed_modules", res.PackedModules)
	return out, nil
}

// Plan makes the repack plan from the input's headers and config (no
// tensor data): a checkpoint that is not compressed-tensors pack-quantized
// is refused here, before any stage of the run starts.
func (s *mlxRepackStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	in := env.Input(s.From)
	if in == nil {
		return nil, fmt.Errorf("mlx_repack: input %q not given", s.From)
	}
	plan, err := mlxpack.PlanRepack(in.Dir, mlxpack.Options{Rewrite: s.Rewrite, Relative: true, Jobs: env.Jobs})
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	return &StagePlan{Summary: fmt.Sprintf("%d entries", len(plan.Entries)), Memory: 64 << 20}, nil
}
