// Package modulepaths holds the names that ferry's MLX directories use to
// record an MTP head, for the packages that must agree on them without
// importing each other: mlxpack writes them, verify reads them. Where each
// checkpoint layout keeps its modules is in the family descriptors
// (internal/family).
package modulepaths

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
