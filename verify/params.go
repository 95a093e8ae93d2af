package verify

import (
	"strings"

	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// How Parameters counted.
const (
	// RuleElements: every tensor's elements, as stored.
	RuleElements = "elements"
	// RuleMLX: mlx-lm's get_total_parameters, what an MLX directory's
	// index records as total_parameters (mlx-lm d78bf58e, utils.py): the
	// parameters of leaf modules only (A_log and dt_bias belong to
	// linear_attn, which has submodules, and are not counted), a quantized
	// module's weight as its logical size (U32 words × 32 / bits) plus its
	// bias, its scales and biases not counted.
	RuleMLX = "mlx-lm total_parameters"
)

// Parameters counts the parameters of a checkpoint or MLX directory's
// tensors (cfg, which may be nil, is its config.json) and says by which
// rule: RuleMLX for an MLX directory with a config (its quantization block
// gives each packed weight's bits), else RuleElements. A packed weight the
// config does not account for is bad input, named by file, tensor and
// offset.
func Parameters(locs []safetensors.Location, cfg *safetensors.Config) (int64, string, error) {
	var shards []*safetensors.Shard
	seen := map[*safetensors.Shard]bool{}
	for _, l := range locs {
		if !seen[l.Shard] {
			seen[l.Shard] = true
			shards = append(shards, l.Shard)
		}
	}
	if cfg == nil || !isMLX(cfg, shards) {
		var n int64
		for _, l := range locs {
			n += l.Info.NumElements()
		}
		return n, RuleElements, nil
	}
	ts := make([]*wTensor, len(locs))
	for i, l := range locs {
		ts[i] = &wTensor{name: l.Info.Name, dtype: l.Info.DType, shape: l.Info.Shape, loc: l, file: l.Shard.Name}
	}
	w := newWeights(ts)
	if err := w.readQuantization(cfg); err != nil {
		return 0, "", err
	}
	// Modules that hold submodules: every proper prefix of a tensor's
	// module path ("" is the model itself).
	parents := map[string]bool{}
	for _, n := range w.names {
		parts := strings.Split(n, ".")
		for k := 0; k < len(parts)-1; k++ {
			parents[strings.Join(parts[:k], ".")] = true
		}
	}
	var n int64
	for _, name := range w.names {
		t := w.byName[name]
		module, param := "", name
		if i := strings.LastIndexByte(name, '.'); i >= 0 {
			module, param = name[:i], name[i+1:]
		}
		if parents[module] {
			continue
		}
		if param == "scales" || param == "biases" {
			if wt, ok := w.get(module + ".weight"); ok {
				if _, q, _ := w.logical(wt); q {
					continue // the quantized weight's, not parameters
				}
			}
		}
		shape, _, problem := w.logical(t)
		off := t.loc.Shard.DataOffset() + t.loc.Info.Begin
		if problem != "" {
			return 0, "", inputerr.New(t.loc.Shard.Path, name, off, ErrBadMetadata, "%s", problem)
		}
		elems, err := tensor.NumElements(shape)
		if err != nil {
			return 0, "", inputerr.New(t.loc.Shard.Path, name, off, ErrBadMetadata, "shape %v: %v", shape, err)
		}
		n += elems
	}
	return n, RuleMLX, nil
}
