package pipeline

import (
	"context"
	"fmt"

	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/mlxpack"
)

// mlxQuantizeStage converts a safetensors checkpoint stage to an MLX
// directory with mlxpack (mlx_lm.convert [-q] semantics), as
// `ferry mlx quantize` does.
//
//	mlx_quantize: { from: merged, bits: 4, group_size: 64, recipe: mixed_3_6, module_bits: ["lm_head=8"], dtype: bf16, keep_mtp: true }
//
// Without bits it converts without quantizing. Resume: mlxpack.Quantize
// builds the directory in mlx.partial in the stage's work dir, with a
// journal of the row blocks already durable, so a killed run redoes only
// the others.
type mlxQuantizeStage struct {
	From       string   `json:"from"`
	Bits       int      `json:"bits,omitempty"`
	GroupSize  int      `json:"group_size,omitempty"`
	Recipe     string   `json:"recipe,omitempty"`
	ModuleBits []string `json:"module_bits,omitempty"`
	DType      string   `json:"dtype,omitempty"`
	KeepMTP    bool     `json:"keep_mtp,omitempty"`

	moduleBits []mlxpack.ModuleBits
}

var _ Stage = (*mlxQuantizeStage)(nil)

func newMLXQuantize(p *Params) (Stage, error) {
	s := &mlxQuantizeStage{}
	var err error
	if s.From, err = p.Ref("from", true); err != nil {
		return nil, err
	}
	bits, err := p.Int("bits", 0)
	if err != nil {
		return nil, err
	}
	gs, err := p.Int("group_size", 64)
	if err != nil {
		return nil, err
	}
	s.Bits, s.GroupSize = int(bits), int(gs)
	if s.Bits != 0 {
		if err := mlxpack.CheckAffine(s.Bits, s.GroupSize); err != nil {
			return nil, p.Errorf("bits", "%v", err)
		}
	}
	if s.Recipe, err = p.String("recipe", false); err != nil {
		return nil, err
	}
	if _, ok := mlxpack.QuantRecipes[s.Recipe]; s.Recipe != "" && !ok {
		return nil, p.Errorf("recipe", "%q: want mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6", s.Recipe)
	}
	if p.Has("module_bits") {
		if s.ModuleBits, err = p.Strings("module_bits", false); err != nil {
			return nil, err
		}
	}
	for _, m := range s.ModuleBits {
		mb, err := mlxpack.ParseModuleBits(m)
		if err != nil {
			return nil, p.Errorf("module_bits", "%v", err)
		}
		s.moduleBits = append(s.moduleBits, mb)
	}
	if (s.Recipe != "" || len(s.ModuleBits) > 0) && s.Bits == 0 {
		return nil, p.Errorf("bits", "recipe and module_bits quantize: give bits too")
	}
	if s.DType, err = p.String("dtype", false); err != nil {
		return nil, err
	}
	if s.KeepMTP, err = p.Bool("keep_mtp", false); err != nil {
		return nil, err
	}
	if s.Bits == 0 {
		s.GroupSize = 0 // not quantizing: the group size means nothing (and is no part of the key)
	}
	return s, nil
}

func (s *mlxQuantizeStage) Params() any { return s }

// plan makes the conversion plan of the input; Close it.
func (s *mlxQuantizeStage) plan(env *Env) (*mlxpack.QuantizePlan, error) {
	_, plan, err := mlxPlan(env, "mlx_quantize", s.From, func(src string) (*mlxpack.QuantizePlan, error) {
		return mlxpack.PlanQuantize(src, mlxpack.QuantizeOptions{Bits: s.Bits, GroupSize: s.GroupSize, Recipe: s.Recipe, ModuleBits: s.moduleBits, DType: s.DType, KeepMTP: s.KeepMTP})
	})
	return plan, err
}

func (s *mlxQuantizeStage) Run(ctx context.Context, env *Env) (*Result, error) {
	plan, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	dst, err := mlxOut(env) // mlx.partial, if any, is what resumes
	if err != nil {
		return nil, err
	}
	env.Progress.SetTotal(plan.SourceBytes())
	// The shards are hashed while they are written (Digests), and adopted
	// under those digests: not read again, one after the other, once
	// the conversion is done; in a run that shares them early, each as
	// soon as it is whole (ShardDone), so that it uploads while the next
	// ones are written. The small files are hashed here.
	ro := mlxpack.QuantizeRunOptions{Jobs: env.Jobs, Progress: env.Progress.Add, Cores: env.Cores, Digests: true}
	if env.SharesEarly() {
		ro.ShardDone = func(path, name string, sum mlxpack.FileSum) error {
			_, _, err := env.AdoptKnown(path, manifest.NewDigest(sum.SHA256), sum.Size)
			if err == nil && mlxShardDone != nil {
				mlxShardDone(name)
			}
			return err
		}
	}
	res, err := mlxpack.Quantize(ctx, plan, dst, ro)
	if err != nil {
		return nil, err
	}
	out := &Result{}
	for _, name := range res.Files {
		var sum *mlxpack.FileSum
		if d, ok := res.Digests[name]; ok {
			sum = &d
		}
		o, err := adoptOutput(env, dst, name, sum)
		if err != nil {
			return nil, err
		}
		out.Outputs = append(out.Outputs, o)
	}
	if res.MTPDropped > 0 {
		env.Log.Info("mlx_quantize: MTP head dropped as mlx-lm does (recorded in config.json); keep_mtp: true keeps it", "tensors", res.MTPDropped)
	}
	return out, nil
}

// Plan makes the conversion plan from the input's headers and config (no
// tensor data): an unsupported model type or a setting MLX cannot express
// is refused here, before any stage of the run starts.
func (s *mlxQuantizeStage) Plan(ctx context.Context, env *Env) (*StagePlan, error) {
	plan, err := s.plan(env)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	what := "no quantization"
	if s.Bits > 0 {
		what = fmt.Sprintf("%d-bit group %d", s.Bits, s.GroupSize)
		if s.Recipe != "" {
			what += " " + s.Recipe
		}
	}
	// A worker holds one row block of at most 1Mi elements: about 14 MiB;
	// the reader hashing a shard as it is written 1 MiB (a shard per file
	// at most).
	return &StagePlan{
		Summary:     fmt.Sprintf("%s, %s, %d tensors, %s", plan.ModelType, what, len(plan.Tensors), FormatBytes(plan.OutputBytes())),
		Memory:      int64(max(env.Jobs, 1))*(14<<20) + int64(len(plan.Files))<<20 + 64<<20,
		OutputBytes: plan.OutputBytes(),
	}, nil
}

// mlxShardDone, set by tests only, is told of each shard the MLX stage
// made a blob while it converted the others.
var mlxShardDone func(name string)
