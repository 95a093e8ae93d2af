package verify

import (
	"fmt"
	"slices"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/safetensors"
)

// Head is what a weight index holds of an MTP head and what the config or
// GGUF metadata promises, found from tensor names and keys alone with the
// conventions MTP checks by — the part of the check that decides where the
// head is, with no verdict. `ferry inspect` shows it.
type Head struct {
	Present bool `json:"present"`
	// Tensors counts Qwen-style head tensors (mtp.*, under any prefix MTP
	// knows: model.mtp., language_model.mtp., …).
	Tensors int `json:"tensors"`
	// NextNLayers and NextNTensors are DeepSeek-style decoder layers with
	// index ≥ num_hidden_layers (looked for when num_nextn_predict_layers
	// is set), or GGUF blocks from block_count - nextn_predict_layers on.
	NextNLayers  []int `json:"nextn_layers,omitempty"`
	NextNTensors int   `json:"nextn_tensors"`
	// Promised is the layer count the config declares, and PromisedBy the
	// key it came from ("" when nothing declares one).
	Promised   int64  `json:"promised_layers"`
	PromisedBy string `json:"promised_by,omitempty"`
}

// FindHead finds the head among names (a checkpoint's or a single shard's
// tensors); cfg, which may be nil, says what is promised.
func FindHead(names []string, cfg *safetensors.Config) Head {
	ts := make([]*wTensor, len(names))
	for i, n := range names {
		ts[i] = &wTensor{name: n}
	}
	w := newWeights(ts)
	var h Head
	for _, key := range []string{"mtp_num_hidden_layers", "num_nextn_predict_layers"} {
		if n, ok := cfg.Int(key); ok && h.PromisedBy == "" {
			h.Promised, h.PromisedBy = n, key
		}
	}
	for _, p := range qwenMTPPrefixes {
		h.Tensors += len(w.withPrefix(p))
	}
	if _, ok := cfg.Int("num_nextn_predict_layers"); ok {
		if hidden, ok := cfg.Int("num_hidden_layers"); ok {
			trunk := trunkPrefixOf(w)
			for _, i := range w.layerIndices(trunk + "layers.") {
				if int64(i) >= hidden {
					h.NextNLayers = append(h.NextNLayers, i)
					h.NextNTensors += len(w.withPrefix(fmt.Sprintf("%slayers.%d.", trunk, i)))
				}
			}
		}
	}
	h.Present = h.Tensors > 0 || h.NextNTensors > 0
	return h
}

// FindGGUFHead finds the head of a GGUF file: the blocks from
// <arch>.block_count - <arch>.nextn_predict_layers on.
func FindGGUFHead(f *gguf.File) Head {
	arch := f.Architecture()
	key := arch + ".nextn_predict_layers"
	bcKV, _ := f.KV(arch + ".block_count")
	nKV, _ := f.KV(key)
	bc, _ := bcKV.Uint()
	n, _ := nKV.Uint()
	var h Head
	if n == 0 {
		return h
	}
	trunk := int64(bc) - int64(n)
	for _, t := range f.Tensors {
		if b, _, ok := blockOf(t.Name); ok && int64(b) >= trunk {
			h.NextNTensors++
			if !slices.Contains(h.NextNLayers, b) {
				h.NextNLayers = append(h.NextNLayers, b)
			}
		}
	}
	slices.Sort(h.NextNLayers)
	h.Promised, h.PromisedBy = int64(n), key
	h.Present = h.NextNTensors > 0
	return h
}

// trunkPrefixOf is where the decoder layers of w live ("model.",
// "model.language_model.", …; "" for bare layers.N), the first of
// trunkPrefixes that holds any.
func trunkPrefixOf(w *weights) string {
	for _, p := range trunkPrefixes {
		if len(w.layerIndices(p+"layers.")) > 0 {
			return p
		}
	}
	return ""
}
