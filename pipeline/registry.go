package pipeline

import "sort"

// Kinds is a set of stage kinds: what a pipeline file may name. A Spec is
// parsed against one (BuiltinKinds unless WithKinds says otherwise) and
// runs with the kinds it was parsed with. A Kinds is never changed after
// it is made: With returns a new one.
type Kinds struct {
	byName map[string]Kind
}

// BuiltinKinds returns the stage kinds ferry ships: an explicit list, one
// entry per kind, each implemented in stage_<kind>.go. A kind whose package
// has not landed yet stays listed with NotBuilt, so `plan` says so and
// `run` refuses before doing anything.
func BuiltinKinds() *Kinds {
	return &Kinds{byName: map[string]Kind{
		"import": {New: newImport, Version: "1",
			Summary: "ingest a local file or directory into the store"},
		"merge": {New: newMerge, Version: "1",
			Summary: "merge a LoRA/DoRA adapter into a base checkpoint"},
		"gguf": {New: newGGUF, Version: "1",
			Summary: "convert a safetensors checkpoint to GGUF (f16, bf16, f32, q8_0)"},
		"quantize": {New: newQuantize, Version: "1",
			Summary: "quantize a GGUF file (Q8_0, K-quant mixes) byte-identical to llama-quantize"},
		"verify_mtp": {New: newVerifyMTP, Version: "1",
			Summary: "check that MTP heads are in the weight index (GGUF, safetensors, MLX)"},
		"mlx_repack": {New: newMLXRepack, Version: "1",
			Summary: "repack a compressed-tensors checkpoint for MLX (no requantization)"},
		"mlx_quantize": {New: newMLXQuantize, Version: "2",
			Summary: "convert a safetensors checkpoint to MLX, affine-quantized as mlx_lm.convert -q does"},
		"transfer": {New: newTransfer, Version: "1",
			Summary: "send outputs to serving hosts over SSH (parallel, sha256-verified on each host, resumable)"},
	}}
}

// With returns a copy of k that also holds kind under name (replacing a
// kind of that name). Tests add their own kinds this way.
func (k *Kinds) With(name string, kind Kind) *Kinds {
	c := &Kinds{byName: make(map[string]Kind, len(k.byName)+1)}
	for n, v := range k.byName {
		c.byName[n] = v
	}
	c.byName[name] = kind
	return c
}

// Lookup returns the kind called name.
func (k *Kinds) Lookup(name string) (Kind, bool) {
	v, ok := k.byName[name]
	return v, ok
}

// Names lists the kinds, sorted.
func (k *Kinds) Names() []string {
	out := make([]string, 0, len(k.byName))
	for n := range k.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
