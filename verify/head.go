package verify

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/family"
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
	var h Head
	for _, key := range []string{"mtp_num_hidden_layers", "num_nextn_predict_layers"} {
		if n, ok := cfg.Int(key); ok && h.PromisedBy == "" {
			h.Promised, h.PromisedBy = n, key
		}
	}
	hd := checkpointHead(newWeights(ts), cfg)
	h.Tensors, h.NextNLayers, h.NextNTensors = len(hd.qwen), hd.nextnLayers, len(hd.nextn)
	h.Present = h.Tensors > 0 || h.NextNTensors > 0
	return h
}

// ckHead is which tensors of a checkpoint or MLX directory are its MTP head.
type ckHead struct {
	qwen        []string // under any prefix Qwen keeps the head at (mtp.*, language_model.mtp.*, …)
	nextnLayers []int    // decoder layers past num_hidden_layers (DeepSeek-style NextN)
	nextn       []string // their tensors
}

func (h ckHead) count() int { return len(h.qwen) + len(h.nextn) }

// checkpointHead is the one definition of a checkpoint's head that both
// FindHead (what `ferry inspect` shows) and MTP (what `ferry verify mtp`
// counts) use: every tensor under a Qwen MTP prefix, quantization
// companions included, and every tensor of a decoder layer at or past
// num_hidden_layers. cfg may be nil.
func checkpointHead(w *weights, cfg *safetensors.Config) ckHead {
	var h ckHead
	for _, p := range family.MTPPrefixes() {
		h.qwen = append(h.qwen, w.withPrefix(p)...)
	}
	if hidden, ok := cfg.Int("num_hidden_layers"); ok {
		trunk := trunkPrefixOf(w)
		for _, i := range w.layerIndices(trunk + "layers.") {
			if int64(i) >= hidden {
				h.nextnLayers = append(h.nextnLayers, i)
				h.nextn = append(h.nextn, w.withPrefix(fmt.Sprintf("%slayers.%d.", trunk, i))...)
			}
		}
	}
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
	n, hasKey := nKV.Uint()
	var h Head
	for _, t := range ggufHead(f, ggufTrunk(bc, n)) {
		b, _, _ := blockOf(t.Name)
		h.NextNTensors++
		if !slices.Contains(h.NextNLayers, b) {
			h.NextNLayers = append(h.NextNLayers, b)
		}
	}
	slices.Sort(h.NextNLayers)
	if hasKey && n > 0 {
		h.Promised, h.PromisedBy = int64(n), key
	}
	h.Present = h.NextNTensors > 0
	return h
}

// ggufTrunk is the number of trunk blocks: block_count less
// nextn_predict_layers, or all of them when that leaves none (llama.cpp
// asserts n_layer_nextn < n_layer_all).
func ggufTrunk(blockCount, nextn uint64) int {
	if nextn >= blockCount {
		return int(min(blockCount, 1<<20))
	}
	return int(blockCount - nextn)
}

// ggufHead is the one definition of a GGUF file's head that both
// FindGGUFHead (what `ferry inspect` shows) and GGUF (what `ferry verify
// mtp` counts) use: every tensor of a block from trunk on (the NextN
// tensors, the decoder block's, the optional shared_head_norm alike), and
// a blk.N.nextn.* tensor in a trunk block.
func ggufHead(f *gguf.File, trunk int) []gguf.TensorInfo {
	var out []gguf.TensorInfo
	for _, t := range f.Tensors {
		if b, rel, ok := blockOf(t.Name); ok && (b >= trunk || strings.HasPrefix(rel, "nextn.")) {
			out = append(out, t)
		}
	}
	return out
}

// trunkPrefixOf is where the decoder layers of w live ("model.",
// "model.language_model.", …; "" for bare layers.N), the first of
// family.TrunkPrefixes (every layout of every family) that holds any.
func trunkPrefixOf(w *weights) string {
	for _, p := range family.TrunkPrefixes() {
		if len(w.layerIndices(p+"layers.")) > 0 {
			return p
		}
	}
	return ""
}
