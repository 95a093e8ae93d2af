package pipeline

import "sort"

// Registry maps every stage kind a pipeline file may name to its
// implementation: an explicit map, one entry per kind, each implemented in
// stage_<kind>.go. A kind whose package has not landed yet stays listed
// with NotBuilt, so `plan` says so and `run` refuses before doing anything.
var Registry = map[string]Kind{
	"import": {New: newImport, Version: "1",
		Summary: "ingest a local file or directory into the store"},
	"synth": {New: newSynth, Version: "1",
		Summary: "test/benchmark stage: deterministic pseudo-random bytes written in journaled units"},
	"merge": {New: newMerge, Version: "1",
		Summary: "merge a LoRA/DoRA adapter into a base checkpoint"},
	"gguf": {New: newGGUF, Version: "1",
		Summary: "convert a safetensors checkpoint to GGUF (f16, bf16, f32, q8_0)"},
	"quantize": {NotBuilt: "gguf/quant/ (K-quants)", RefKeys: []string{"from"},
		Summary: "quantize a GGUF file"},
	"verify_mtp": {New: newVerifyMTP, Version: "1",
		Summary: "check that MTP heads are in the weight index (GGUF, safetensors, MLX)"},
	"mlx_repack": {New: newMLXRepack, Version: "1",
		Summary: "repack a compressed-tensors checkpoint for MLX (no requantization)"},
	"mlx_quantize": {NotBuilt: "mlxpack/ (MLX affine quantization; not landed)", RefKeys: []string{"from"},
		Summary: "MLX affine quantization"},
	"transfer": {NotBuilt: "transfer/", RefKeys: []string{"from"},
		Summary: "send outputs to serving hosts over SSH"},
}

// KindNames lists the registered kinds, sorted.
func KindNames() []string {
	var out []string
	for k := range Registry {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
