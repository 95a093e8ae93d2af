// Package family holds one descriptor per model family: the facts every
// format package needs about it, in one place, so that adding a family is
// one file here (plus, only when its tensor transforms are new, a writer in
// gguf/convert or a sanitize in mlxpack) and its tests.
//
// A descriptor is data: the Hugging Face names (architectures[0] of each
// layout, model_type and its aliases), where each layout keeps its modules
// (text-only, vision-language), the MTP convention, the GGUF architecture
// with what llama-quantize's type rules read of it, and what mlx-lm's
// sanitize and quant predicate do, as far as that is data. Behaviour that is
// code stays in the format package and is named here by a kind the format
// resolves: GGUF.Class is the convert_hf_to_gguf.py class whose transforms
// gguf/convert applies (gguf/convert/<class>.go), MLX.Sanitize the mlx-lm
// sanitize mlxpack applies (mlxpack/sanitize.go). A family whose kind a
// format does not have is refused there as an unsupported one.
//
// The package imports no format (internal/layering), so every format can
// read it.
package family

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
)

// Family is one model family's descriptor.
type Family struct {
	// Name is ferry's name for the family (its file here): "qwen35".
	Name string
	// Layouts are the checkpoint layouts of the family as Hugging Face
	// saves them, each named by its config.json architectures[0]: the
	// text-only layout first, then the vision-language one, if any.
	Layouts []Layout
	// ModelTypes are the config.json model_type values of the family
	// (top level, or text_config's in a vision-language layout), the one
	// transformers writes for the text-only layout first.
	ModelTypes []string
	// MTP is where the family keeps a multi-token-prediction head.
	MTP MTP
	// GGUF is what the GGUF writer and llama-quantize know of it; nil when
	// ferry writes no GGUF for it and llama.cpp has no rules for it.
	GGUF *GGUF
	// MLX is what mlx-lm does with it; nil when ferry's MLX commands do
	// not take it.
	MLX *MLX
}

// Layout is one way a family's checkpoint is laid out on disk.
type Layout struct {
	// Architecture is config.json architectures[0]: "Qwen3_5ForCausalLM",
	// "Qwen3_5ForConditionalGeneration".
	Architecture string
	// Vision: a vision-language layout (a vision tower beside the text
	// decoder).
	Vision bool
	// TextConfig: the decoder's hyperparameters are nested under
	// config.json's text_config (vision_config beside it).
	TextConfig bool
	// Trunk is the prefix of the text decoder's modules:
	// "model." (…ForCausalLM) or "model.language_model."
	// (…ForConditionalGeneration); the lm_head stays at the top level.
	Trunk string
	// VisionTower is the prefix of the vision tower's modules
	// ("model.visual."), "" in a text-only layout.
	VisionTower string
}

// Prefixes of the Hugging Face layouts: the text decoder of a
// …ForCausalLM checkpoint, of a …ForConditionalGeneration one (Qwen3.5,
// Qwen3.6), its vision tower, and the top-level MTP head (both layouts).
const (
	HFTrunk         = "model."
	HFLanguageModel = "model.language_model."
	HFVisual        = "model.visual."
	HFMTP           = "mtp."
)

// mlx-lm's qwen3_5 and qwen3_5_moe sanitize (mlx-lm d78bf58e) move
// model.language_model.* (and a text-only checkpoint's model.*) to
// language_model.model.* and the MTP head to language_model.mtp.*.
const (
	MLXQwen35Trunk = "language_model.model."
	MLXQwen35MTP   = "language_model.mtp."
)

// Convention names where a checkpoint keeps its MTP head.
type Convention string

// The conventions.
const (
	// NoMTP: the family has no MTP head.
	NoMTP Convention = ""
	// QwenMTP: Qwen3.5 / Qwen3.6 / Qwen3-Next keep the head at the top
	// level under mtp. (mtp.fc, mtp.pre_fc_norm_{embedding,hidden},
	// mtp.norm, mtp.layers.i.*), also in the vision-language layout.
	QwenMTP Convention = "qwen-mtp"
	// NextNLayer: DeepSeek-V3 / GLM-4.5 keep it as extra decoder layers
	// model.layers.{num_hidden_layers+k}.* (embed_tokens, enorm, hnorm,
	// eh_proj, shared_head.*).
	NextNLayer Convention = "nextn-layer"
)

// MTP is a family's multi-token-prediction head in its checkpoints and
// in MLX. In a GGUF every family's head has llama.cpp's one layout, whatever
// its convention: the last {arch}.nextn_predict_layers blocks, holding
// blk.N.nextn.* beside a decoder block (the writer class keeps it:
// convert_hf_to_gguf.py's _QwenMtpMixin in Qwen3NextModel and
// Qwen3_5TextModel).
type MTP struct {
	Convention Convention
	// Prefix is where a QwenMTP head's modules are ("mtp.").
	Prefix string
	// CountKey is the config.json key that promises the head's layers:
	// mtp_num_hidden_layers (Qwen3.5), num_nextn_predict_layers
	// (Qwen3-Next, DeepSeek-V3).
	CountKey string
	// MLXPrefix is where mlx-lm's sanitize puts a kept head
	// ("language_model.mtp."; ferry mlx quantize --keep-mtp writes it
	// in side files, internal/modulepaths); "" when mlx quantize cannot
	// keep it.
	MLXPrefix string
}

// GGUF is what ferry's GGUF writer and llama-quantize know of a family.
type GGUF struct {
	// Arch is general.architecture (llama.cpp's LLM_ARCH name).
	Arch string
	// Class is the convert_hf_to_gguf.py class (34af94c) whose class chain
	// of tensor transforms and keys the writer applies; gguf/convert
	// resolves it to its writer. "" when ferry quantizes llama.cpp's
	// files of this arch but does not write them.
	Class string
	// MMProjClass is the convert_hf_to_gguf.py --mmproj class
	// (MMPROJ_MODEL_MAP) that writes the vision tower of the family's
	// vision-language layouts as a CLIP GGUF; gguf/convert resolves it.
	// "" when ferry writes no mmproj for the family.
	MMProjClass string
	// Pre is the default tokenizer.ggml.pre.
	Pre string
	// Tensors are the GGUF tensor stems of a block the architecture has
	// (gguf-py MODEL_TENSORS[arch], less token_embd, output_norm and
	// output, which every architecture has); PostAttentionNorm is what
	// post_attention_layernorm becomes (ffn_norm, post_attention_norm).
	Tensors           []string
	PostAttentionNorm string
	// Quant is what llama-quantize's type rules read of the arch.
	Quant QuantRules
}

// QuantRules are the arch-specific parts of llama-quantize's type rules
// (llama_tensor_get_type_impl and the loader's model size, 34af94c).
type QuantRules struct {
	// Blocks70B is the block_count at which llama.cpp's loader sets
	// LLM_TYPE_70B, the one model size the rules read (0: never).
	Blocks70B uint32
	// Llama70B: the 70B size also needs grouped KV heads and not eight
	// experts (load_arch_hparams of llama).
	Llama70B bool
	// Falcon: the LLM_ARCH_FALCON branches of the rules.
	Falcon bool
	// NoHParams: the loader reads no hyperparameters (LLM_ARCH_CLIP, a
	// multimodal projector): every count is 0 and the rules run with
	// block_count 0.
	NoHParams bool
}

// MLX is what mlx-lm (d78bf58e, 0.32.0) does with a family.
type MLX struct {
	// ModelType is the mlx-lm model (mlx_lm/models/<ModelType>.py).
	ModelType string
	// Aliases are model types transformers writes that mlx-lm has no
	// module for and loads as ModelType once the config says so
	// (qwen3_5_text → qwen3_5: ferry rewrites model_type).
	Aliases []string
	// Remapped are model types mlx-lm loads with this model without
	// rewriting the config (utils.MODEL_REMAPPING: mistral → llama), or
	// whose sanitize calls this one's (kimi_k25).
	Remapped []string

	// Repack (compressed-tensors checkpoints, ferry mlx repack).
	//
	// RenamesPacked: sanitize maps weight_packed/weight_scale/weight_shape
	// to weight/scales/biases (deepseek_v3.py "Remap for int4").
	RenamesPacked bool
	// StacksExperts: sanitize stacks per-expert .weight tensors into
	// switch_mlp.
	StacksExperts bool
	// Paths names how sanitize moves module paths (mlxpack resolves it):
	// "same", "switch_mlp", "deepseek_v3", "qwen3_5_moe"; "" when ferry
	// does not know them.
	Paths string

	// Trunk is where mlx-lm's sanitize puts the text decoder
	// (language_model.model. for qwen3_5); "" when it keeps the Hugging
	// Face trunk.
	Trunk string

	// Quantize (ferry mlx quantize).
	//
	// Sanitize names mlx-lm's Model.sanitize (mlxpack resolves it); ""
	// when mlx quantize does not convert the family.
	Sanitize string
	// LayerOrder is the order a decoder layer's modules are defined in
	// mlx-lm's class, the order save_model writes them.
	LayerOrder []string
	// RouterGates are the path suffixes the model's quant_predicate keeps
	// at 8 bits, group 64; RouterGatesNeedExperts: only when num_experts
	// > 0 (qwen3_5's Model serves dense and MoE).
	RouterGates            []string
	RouterGatesNeedExperts bool
	// KeepDType are the path suffixes the model's cast_predicate keeps in
	// their source dtype.
	KeepDType []string
	// RopeTopLevel are rope_parameters keys transformers 5 keeps only
	// there and mlx-lm's ModelArgs read at the top level (copied; a
	// non-default rope_parameters also becomes rope_scaling).
	// RopeTypeAsType: the model's TextModelArgs renames
	// rope_parameters.rope_type to type (in text_config when nested).
	RopeTopLevel   []string
	RopeTypeAsType bool
}

// Module layouts shared by several families.
var (
	// DenseLayerOrder: llama.py, qwen2.py, qwen3.py's TransformerBlock.
	DenseLayerOrder = []string{"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
	// HybridLayerOrder: qwen3_next.py and qwen3_5.py's DecoderLayer.
	HybridLayerOrder = []string{"linear_attn", "self_attn", "input_layernorm", "post_attention_layernorm", "mlp"}
)

// registry is every registered family: the builtin ones (builtin.go) and
// any a test registers.
var registry = struct {
	sync.RWMutex
	all []*Family
}{all: mustBuiltin()}

func mustBuiltin() []*Family {
	var all []*Family
	for _, f := range builtin {
		if err := check(all, f); err != nil {
			panic("family: builtin " + err.Error())
		}
		all = append(all, f)
	}
	return all
}

// Register adds f to the families every package reads, after checking
// that it is complete and claims no name another family has. remove takes
// it out again (tests). The builtin families are listed in builtin.go.
func Register(f *Family) (remove func(), err error) {
	registry.Lock()
	defer registry.Unlock()
	if err := check(registry.all, f); err != nil {
		return nil, err
	}
	registry.all = append(registry.all, f)
	return func() {
		registry.Lock()
		defer registry.Unlock()
		registry.all = slices.DeleteFunc(registry.all, func(g *Family) bool { return g == f })
	}, nil
}

// check refuses an incomplete descriptor, or one that claims a name (family
// name, architectures[0], model type, GGUF arch, MLX model type) that a
// family of all has.
func check(all []*Family, f *Family) error {
	if f == nil || f.Name == "" {
		return errors.New("a family needs a name")
	}
	if len(f.Layouts) == 0 && f.GGUF == nil {
		return fmt.Errorf("family %s: no layout and no GGUF arch: nothing could find it", f.Name)
	}
	for _, l := range f.Layouts {
		if l.Architecture == "" || l.Trunk == "" {
			return fmt.Errorf("family %s: a layout needs its architectures[0] and trunk prefix", f.Name)
		}
		if l.Vision != (l.VisionTower != "") {
			return fmt.Errorf("family %s: layout %s: a vision-language layout names its vision tower's prefix, a text-only one none", f.Name, l.Architecture)
		}
	}
	if f.MTP.Convention == QwenMTP && (f.MTP.Prefix == "" || f.MTP.CountKey == "") {
		return fmt.Errorf("family %s: a qwen-mtp head needs its prefix and count key", f.Name)
	}
	if g := f.GGUF; g != nil && (g.Arch == "" || (g.Class != "" && g.PostAttentionNorm == "")) {
		return fmt.Errorf("family %s: a GGUF writer needs the arch and what post_attention_layernorm becomes", f.Name)
	}
	if m := f.MLX; m != nil && (m.ModelType == "" || (m.Sanitize != "" && len(m.LayerOrder) == 0)) {
		return fmt.Errorf("family %s: mlx-lm's model type, and for mlx quantize its layer order, are needed", f.Name)
	}
	claims := func(g *Family) map[string]string {
		c := map[string]string{"family name " + g.Name: g.Name}
		for _, l := range g.Layouts {
			c["architectures[0] "+l.Architecture] = g.Name
		}
		for _, t := range g.ModelTypes {
			c["model_type "+t] = g.Name
		}
		if g.GGUF != nil {
			c["GGUF arch "+g.GGUF.Arch] = g.Name
		}
		if g.MLX != nil {
			for _, t := range append(append([]string{g.MLX.ModelType}, g.MLX.Aliases...), g.MLX.Remapped...) {
				c["mlx-lm model type "+t] = g.Name
			}
		}
		return c
	}
	mine := claims(f)
	for _, g := range all {
		if g == f {
			return fmt.Errorf("family %s is registered already", f.Name)
		}
		for what := range claims(g) {
			if _, ok := mine[what]; ok {
				return fmt.Errorf("family %s: %s is family %s's", f.Name, what, g.Name)
			}
		}
	}
	return nil
}

// All lists the registered families by name.
func All() []*Family {
	registry.RLock()
	defer registry.RUnlock()
	out := slices.Clone(registry.all)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func find(keep func(*Family) bool) *Family {
	registry.RLock()
	defer registry.RUnlock()
	for _, f := range registry.all {
		if keep(f) {
			return f
		}
	}
	return nil
}

// ByArchitecture is the family and layout of a config.json
// architectures[0].
func ByArchitecture(arch string) (*Family, Layout, bool) {
	var lay Layout
	f := find(func(f *Family) bool {
		for _, l := range f.Layouts {
			if l.Architecture == arch {
				lay = l
				return true
			}
		}
		return false
	})
	return f, lay, f != nil
}

// ByModelType is the family of a config.json model_type (top level or
// text_config's).
func ByModelType(mt string) (*Family, bool) {
	f := find(func(f *Family) bool { return slices.Contains(f.ModelTypes, mt) })
	return f, f != nil
}

// ByConfig is the family of a checkpoint: by its architectures[0], else by
// its model_type, else by text_config's.
func ByConfig(arch, modelType, textModelType string) (*Family, bool) {
	if f, _, ok := ByArchitecture(arch); ok {
		return f, true
	}
	if f, ok := ByModelType(modelType); ok {
		return f, true
	}
	return ByModelType(textModelType)
}

// ByGGUFArch is the family of a GGUF general.architecture.
func ByGGUFArch(arch string) (*Family, bool) {
	f := find(func(f *Family) bool { return f.GGUF != nil && f.GGUF.Arch == arch })
	return f, f != nil
}

// ByMLXModelType is the family mlx-lm loads a model_type with, and the
// model type mlx-lm names it (aliases resolved: qwen3_5_text → qwen3_5;
// remapped types kept: mistral stays mistral).
func ByMLXModelType(mt string) (*Family, bool) {
	f := find(func(f *Family) bool {
		return f.MLX != nil && (f.MLX.ModelType == mt || slices.Contains(f.MLX.Aliases, mt) || slices.Contains(f.MLX.Remapped, mt))
	})
	return f, f != nil
}

// QuantRulesOf are llama-quantize's rules for a GGUF arch: the zero value
// (no arch-specific rule) for an arch no family has.
func QuantRulesOf(arch string) QuantRules {
	if f, ok := ByGGUFArch(arch); ok {
		return f.GGUF.Quant
	}
	return QuantRules{}
}

// Architectures lists, sorted, the architectures[0] of every layout that
// keep accepts with its family.
func Architectures(keep func(*Family, Layout) bool) []string {
	var out []string
	for _, f := range All() {
		for _, l := range f.Layouts {
			if keep(f, l) {
				out = append(out, l.Architecture)
			}
		}
	}
	sort.Strings(out)
	return out
}

// MLXModelTypes lists, sorted, the model types (with aliases and remapped
// types) of every family whose MLX part satisfies keep.
func MLXModelTypes(keep func(*MLX) bool) []string {
	var out []string
	for _, f := range All() {
		if f.MLX != nil && keep(f.MLX) {
			out = append(out, f.MLX.ModelType)
			out = append(out, f.MLX.Aliases...)
			out = append(out, f.MLX.Remapped...)
		}
	}
	sort.Strings(out)
	return out
}

// TrunkPrefixes are where the registered families keep decoder layers,
// in any layout (each Layout.Trunk, each MLX.Trunk), longest first, then
// "" (bare layers.N): verify looks for the trunk under each in turn.
func TrunkPrefixes() []string {
	var out []string
	add := func(p string) {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	registry.RLock()
	for _, f := range registry.all {
		for _, l := range f.Layouts {
			add(l.Trunk)
		}
		if f.MLX != nil {
			add(f.MLX.Trunk)
		}
	}
	registry.RUnlock()
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return append(out, "")
}

// VisionTowers are the vision-tower prefixes of the registered families'
// vision-language layouts, in registration order, each once.
func VisionTowers() []string {
	var out []string
	registry.RLock()
	defer registry.RUnlock()
	for _, f := range registry.all {
		for _, l := range f.Layouts {
			if l.VisionTower != "" && !slices.Contains(out, l.VisionTower) {
				out = append(out, l.VisionTower)
			}
		}
	}
	return out
}

// MTPPrefixes are where the registered families with a QwenMTP head keep
// it, in any layout: at MTP.Prefix (top level), under model. (an older
// layout), at MTP.MLXPrefix, and under each layout's and MLX's trunk; in
// registration order, each once.
func MTPPrefixes() []string {
	var out []string
	add := func(p string) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	registry.RLock()
	defer registry.RUnlock()
	for _, f := range registry.all {
		m := f.MTP
		if m.Convention != QwenMTP {
			continue
		}
		add(m.Prefix)
		add(HFTrunk + m.Prefix)
		if m.MLXPrefix != "" {
			add(m.MLXPrefix)
		}
		for _, l := range f.Layouts {
			add(l.Trunk + m.Prefix)
		}
		if f.MLX != nil && f.MLX.Trunk != "" {
			add(f.MLX.Trunk + m.Prefix)
		}
	}
	return out
}

// HasSuffix reports whether path ends with one of suffixes.
func HasSuffix(path string, suffixes []string) bool {
	for _, s := range suffixes {
		if strings.HasSuffix(path, s) {
			return true
		}
	}
	return false
}
