package mlxpack

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/modulepaths"
	"github.com/ferry-llm/ferry/safetensors"
)

// configEdit is what changes between a source config.json and the one an
// MLX directory carries. Repack and quantize write their configs through
// mlxConfig with one.
type configEdit struct {
	// quant is the quantization block (also written as
	// quantization_config): a map or a json.Marshaler (QuantBlock, which
	// keeps mlx-lm's key order); nil writes neither.
	quant any
	// eos, when set, replaces eos_token_id (mlx-lm's load_config takes
	// generation_config.json's, and convert saves it).
	eos any
	// mtpDropped, when > 0, records that the MTP head (this many layers)
	// was left out: the count key becomes 0 and MTPRecordKey says why.
	mtpDropped int64
	mtpTensors int
	// mtpSide, when set, records that the MTP head was kept in side files
	// (modulepaths.MTPSideFile): the count key stays, MTPSideKey says where.
	mtpSide *mtpSide
	// dropSaveKeys drops what mlx-lm's save_config drops
	// (_name_or_path, vision_config).
	dropSaveKeys bool
	// order is the source config.json's key order: nested objects keep
	// it, as mlx-lm's save_config (which sorts the top level only) does.
	order *keyOrder
}

// MTPRecordKey is the config.json key where ferry records an MTP head it
// left out of an MLX directory; verify reads it to tell a deliberate drop
// from a lost head.
const MTPRecordKey = modulepaths.MTPDroppedKey

// mtpSide is a kept MTP head's place: its side files, its layers, the
// tensors they hold.
type mtpSide struct {
	files   []string
	layers  int64
	tensors int
}

// MTPSideKey is the config.json key where ferry records an MTP head it kept
// in side files beside model*.safetensors.
const MTPSideKey = modulepaths.MTPSideKey

// FixedConfig returns a copy of raw with the changes mlx-lm 0.32 needs to
// load a config transformers 5 wrote, and the list of what changed (for
// reports). Only model types ferry knows are touched, as their family
// descriptors say (internal/family MLX: Aliases, RopeTypeAsType,
// RopeTopLevel):
//   - model_type qwen3_5_text / qwen3_5_moe_text (a text-only Qwen3.5
//     checkpoint) → qwen3_5 / qwen3_5_moe, which mlx-lm loads (it has no
//     module for the _text types);
//   - rope_theta (and partial_rotary_factor for qwen3_next), which
//     transformers 5 keeps only inside rope_parameters, copied to the top
//     level where mlx-lm's ModelArgs read them (qwen3, qwen3_moe and
//     qwen3_next require them; llama and qwen2 would silently use a
//     default base); a non-default rope_parameters also becomes
//     rope_scaling, where those ModelArgs read the scaling type;
//   - for qwen3_5: rope_parameters.rope_type renamed to type, as mlx-lm's
//     TextModelArgs does in memory before convert saves the config.
func FixedConfig(raw map[string]any) (map[string]any, []string) {
	out := cloneJSON(raw).(map[string]any)
	var changed []string
	mt, _ := out["model_type"].(string)
	f, ok := desc.ByMLXModelType(mt)
	if !ok {
		return out, changed
	}
	if to := f.MLX.ModelType; slices.Contains(f.MLX.Aliases, mt) {
		out["model_type"] = to
		changed = append(changed, fmt.Sprintf("model_type %s → %s", mt, to))
	}
	switch {
	case f.MLX.RopeTypeAsType:
		text := out
		if tc, ok := out["text_config"].(map[string]any); ok {
			text = tc
		}
		if rp, ok := text["rope_parameters"].(map[string]any); ok {
			if _, has := rp["type"]; !has {
				if v, has := rp["rope_type"]; has {
					delete(rp, "rope_type")
					rp["type"] = v
					changed = append(changed, "rope_parameters.rope_type → type")
				}
			}
		}
	case len(f.MLX.RopeTopLevel) > 0:
		rp, ok := out["rope_parameters"].(map[string]any)
		if !ok {
			break
		}
		for _, k := range f.MLX.RopeTopLevel {
			if _, has := out[k]; !has {
				if v, ok := rp[k]; ok {
					out[k] = v
					changed = append(changed, k+" copied from rope_parameters")
				}
			}
		}
		if rt, _ := rp["rope_type"].(string); rt != "" && rt != "default" && out["rope_scaling"] == nil {
			s := cloneJSON(rp).(map[string]any)
			out["rope_scaling"] = s
			changed = append(changed, "rope_scaling from rope_parameters ("+rt+")")
		}
	}
	return out, changed
}

// mlxConfig is the config.json of an MLX directory: src (already fixed)
// plus the edit, as mlx-lm's save_config writes it (json.dump, indent 4):
// top-level keys sorted, nested objects in the source's order with keys
// added at their end.
func mlxConfig(src map[string]any, e configEdit) ([]byte, error) {
	out := cloneJSON(src).(map[string]any)
	if e.dropSaveKeys {
		delete(out, "_name_or_path")
		delete(out, "vision_config")
	}
	if e.eos != nil {
		out["eos_token_id"] = e.eos
	}
	if e.mtpDropped > 0 {
		holder := out
		if tc, ok := out["text_config"].(map[string]any); ok {
			if _, has := tc["mtp_num_hidden_layers"]; has {
				holder = tc
			}
		}
		key := "mtp_num_hidden_layers"
		if _, has := holder[key]; !has {
			if _, has := holder["num_nextn_predict_layers"]; has {
				key = "num_nextn_predict_layers"
			}
		}
		holder[key] = 0
		out[MTPRecordKey] = map[string]any{
			"layers":  e.mtpDropped,
			"tensors": e.mtpTensors,
			"key":     key,
			"reason":  "released mlx-lm discards the MTP head at load (its sanitize drops every \"mtp.\" key); ferry mlx quantize left it out and set " + key + " to 0. --keep-mtp keeps it",
		}
	}
	if m := e.mtpSide; m != nil {
		out[MTPSideKey] = map[string]any{
			"files":   m.files,
			"layers":  m.layers,
			"tensors": m.tensors,
			"reason": "the MTP head (mlx-lm PR #990's names, language_model.mtp.*; norms shifted and modules quantized as the trunk's) is kept in these files, " +
				"which mlx-lm's loader does not read (it loads model*.safetensors only): mlx-lm up to v0.31.3 shifts every norm again when mtp.* keys are among the weights it loads (silent garbage), " +
				"so every mlx-lm loads the trunk alone, exactly as without the head. model.safetensors.index.json lists the head's tensors; a loader that uses the head reads them from these files",
		}
	}
	if e.quant != nil {
		out["quantization"] = e.quant
		out["quantization_config"] = e.quant
	}
	return pyJSON(out, e.order, true)
}

// maxConfigBytes bounds a config.json read for its key order (the limit
// safetensors.ReadConfig already applied to the same file).
const maxConfigBytes = 16 << 20

// configOrder reads the key order of the config.json at path.
func configOrder(path string) (*keyOrder, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, errf(path, "", safetensors.ErrInvalidConfig, "config over %d bytes", maxConfigBytes)
	}
	o, err := keyOrderOf(data)
	if err != nil {
		return nil, errf(path, "", safetensors.ErrInvalidConfig, "changed while it was read, or not JSON: %v", err)
	}
	return o, nil
}

func cloneJSON(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = cloneJSON(x)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, x := range v {
			s[i] = cloneJSON(x)
		}
		return s
	}
	return v
}

// hasQuantization reports a config that says its weights are quantized
// already: an MLX quantization block, or a quantization_config (top level
// or in text_config) of any method.
func hasQuantization(raw map[string]any) (string, bool) {
	if _, ok := raw["quantization"]; ok {
		return "an MLX \"quantization\" block", true
	}
	if qc, ok := quantizationConfig(raw); ok {
		m, _ := qc["quant_method"].(string)
		return fmt.Sprintf("quantization_config (quant_method %q)", strings.TrimSpace(m)), true
	}
	return "", false
}
