package family

// GGUF architectures ferry does not write but quantizes as llama-quantize
// does, for the rules that read the arch (34af94c: load_arch_hparams sets
// LLM_TYPE_70B for deci, olmo and qwen2 at 80 blocks and jais2 at 68;
// llama_tensor_get_type_impl has falcon branches; a clip file, an mmproj,
// has no hyperparameters the loader reads).
var (
	deci   = Family{Name: "deci", GGUF: &GGUF{Arch: "deci", Quant: QuantRules{Blocks70B: 80}}}
	olmo   = Family{Name: "olmo", GGUF: &GGUF{Arch: "olmo", Quant: QuantRules{Blocks70B: 80}}}
	jais2  = Family{Name: "jais2", GGUF: &GGUF{Arch: "jais2", Quant: QuantRules{Blocks70B: 68}}}
	falcon = Family{Name: "falcon", GGUF: &GGUF{Arch: "falcon", Quant: QuantRules{Falcon: true}}}
	clip   = Family{Name: "clip", GGUF: &GGUF{Arch: "clip", Quant: QuantRules{NoHParams: true}}}
)
