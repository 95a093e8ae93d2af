package family

// builtin are the families ferry knows, one file each. Adding a family is
// adding its file and its line here.
var builtin = []*Family{
	&llama,
	&qwen2,
	&qwen3,
	&qwen3MoE,
	&qwen3Next,
	&qwen35,
	&qwen35MoE,
	&deepseekV3,
	&deci, &olmo, &jais2, &falcon, &clip,
}
