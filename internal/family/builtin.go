package family

// builtin are the families ferry knows, one file each. Adding a family is
// adding its file and its line here.
var builtin = []*Family{
	&Llama,
	&Qwen2,
	&Qwen3,
	&Qwen3MoE,
	&Qwen3Next,
	&Qwen35,
	&Qwen35MoE,
	&DeepseekV3,
	&Deci, &Olmo, &Jais2, &Falcon,
}
