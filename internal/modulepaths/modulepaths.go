// Package modulepaths holds where checkpoints keep their modules, per
// layout, for the packages that must agree on it without importing each
// other: mlxpack maps Hugging Face names to what mlx-lm's sanitize makes of
// them, and verify finds a model's trunk and MTP head in either layout.
package modulepaths

// Hugging Face *ForConditionalGeneration checkpoints (Qwen3.5, Qwen3.6)
// keep the text decoder under model.language_model. and the MTP head at
// the top level.
const (
	HFLanguageModel = "model.language_model."
	HFMTP           = "mtp."
)

// mlx-lm's qwen3_5 and qwen3_5_moe sanitize (mlx-lm d78bf58e) move
// model.language_model.* to language_model.model.* and the MTP head to
// language_model.mtp.*.
const (
	MLXQwen35Trunk = "language_model.model."
	MLXQwen35MTP   = "language_model.mtp."
)

// MTPDroppedKey is the config.json key where ferry mlx quantize records
// an MTP head it left out of an MLX directory (an object: layers,
// tensors, key, reason); verify reads it to tell a deliberate drop from a
// lost head.
const MTPDroppedKey = "ferry_mtp_dropped"

// An MLX directory keeps a kept MTP head in side files beside its weights:
// mtp.safetensors, or mtp-0000i-of-0000n.safetensors when it is split.
// mlx-lm's load_model reads only model*.safetensors, which these names do
// not match, so every mlx-lm loads the trunk alone, as if the head were
// not there (mlx-lm up to v0.31.3 would shift every norm a second time if
// mtp.* keys were among the weights it loads). model.safetensors.index.json
// lists the head's tensors under these files.
const (
	MTPSideStem = "mtp"
	MTPSideFile = MTPSideStem + ".safetensors"
)

// MTPSideKey is the config.json key where ferry mlx quantize records an
// MTP head it kept in side files (an object: files, layers, tensors,
// reason).
const MTPSideKey = "ferry_mtp_side_file"
