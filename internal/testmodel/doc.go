// Package testmodel writes deterministic tiny Hugging Face checkpoints and
// PEFT adapters for ferry's tests and benchmarks, through ferry's own
// safetensors writer.
//
// Each family has an options struct whose zero value is a small valid
// model (hidden 64, a few layers, vocab 512, BF16, 64 KiB shards so there
// are several shards and an index) and a Write(dir) method returning a
// *Model that records what was written: tensor names, dtypes, shapes,
// shards, config, and the values of every tensor (Model.Values), so a test
// can compute expected results without reading the files back.
//
//   - LlamaOptions    LlamaForCausalLM (model_type llama)
//   - Qwen2Options    Qwen2ForCausalLM (q/k/v biases)
//   - Qwen3Options    Qwen3ForCausalLM (q_norm/k_norm, optional tied embeddings)
//   - Qwen3MoEOptions Qwen3MoeForCausalLM (router + per-expert MLPs)
//   - Qwen35Options   Qwen3_5ForCausalLM hybrid (Gated DeltaNet + gated full
//     attention, 15 mtp.* tensors in the last shard), optionally in the
//     Qwen3_5ForConditionalGeneration layout, or with the MTP tensors
//     dropped while the config keeps mtp_num_hidden_layers
//   - Qwen35MoEOptions Qwen3_5MoeForCausalLM (per-expert or fused experts)
//   - with Vision set, either is the vision-language wrapper
//     (Qwen3_5(Moe)ForConditionalGeneration: model.visual.* vision tower,
//     vision_config, vision tokens, preprocessor_config.json); Qwen35VL and
//     Qwen35MoEVL write a whole set, base/ and a DoRA adapter-dora/ on the
//     language model (keys under model.language_model), the layout of
//     ../shared/reference/qwen35vl
//   - Qwen3NextOptions Qwen3NextForCausalLM (fused in_proj_qkvz / in_proj_ba)
//   - DeepSeekV3Options DeepseekV3ForCausalLM with NextN layers model.layers.{N}
//
// Every options type also has Layout(), which returns the same *Model
// without writing anything (sizes, names, shards; Values still work).
//
// Qwen35Reference and Qwen3Reference reproduce the dimensions, tensor names,
// shapes, shard layout, index and configs of the reference checkpoints in
// ../shared/reference; Large27B gives Qwen3.5-27B widths for benchmarks
// (Large27B(4) is the anchors.md slice, 4,489,576,096 parameters), written
// at disk speed by repeating a generated block (Common.RepeatBlock).
//
// AdapterOptions writes a PEFT LoRA/DoRA adapter for a *Model (Write) or
// for any checkpoint directory (WriteForDir); its adapter_config.json is
// byte-identical to peft 0.21's for the same settings. The returned
// *Adapter lists each adapted module (r, alpha, scale, in/out features,
// tensor keys) and gives every adapter tensor's values.
//
// Values come from a per-tensor splitmix64 stream seeded by (Seed, tensor
// name): matrices N(0, 0.02), norm weights at their init (1, or 0 for the
// zero-centred Qwen3.5 norms) plus N(0, 0.05), as in the reference data.
// The same options and seed give byte-identical files.
//
// Example:
//
//	m, err := testmodel.Qwen35Options{Common: testmodel.Common{Seed: 7}}.Write(t.TempDir())
//	if err != nil { t.Fatal(err) }
//	w, _ := m.Values("model.layers.3.self_attn.q_proj.weight") // as stored, as float32
//	a, err := testmodel.AdapterOptions{R: 8, Alpha: 16, DoRA: true,
//		TargetModules: []string{"q_proj", "v_proj", "in_proj_qkv"}}.Write(t.TempDir(), m)
//	// a.Modules lists each adapted module with its r, alpha, scale and tensor keys;
//	// a.Values(key) gives the adapter's F32 values.
package testmodel
