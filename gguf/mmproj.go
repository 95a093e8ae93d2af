package gguf

import (
	"strconv"
	"strings"
)

// MMProj is what a multimodal projector file (an mmproj, as
// convert_hf_to_gguf.py --mmproj writes it and llama.cpp's --mmproj and LM
// Studio load it beside a text GGUF) says of itself in its clip.* keys.
// It holds a vision (or audio) tower and the projector into the text
// model's embedding, no text weights, no tokenizer and no MTP head.
type MMProj struct {
	// Projector is clip.projector_type (clip.vision.projector_type for a
	// file with several encoders), e.g. qwen3vl_merger.
	Projector string `json:"projector,omitempty"`
	// Vision is clip.has_vision_encoder; the rest describe that encoder.
	Vision          bool   `json:"vision"`
	Audio           bool   `json:"audio,omitempty"`
	Blocks          uint64 `json:"vision_blocks,omitempty"`
	EmbeddingLength uint64 `json:"vision_embedding_length,omitempty"`
	ProjectionDim   uint64 `json:"projection_dim,omitempty"`
	ImageSize       uint64 `json:"image_size,omitempty"`
	PatchSize       uint64 `json:"patch_size,omitempty"`
}

// MMProj reports whether f is a multimodal projector (general.type mmproj,
// or general.architecture clip, which llama.cpp reserves for them) and
// what its clip.* keys say.
func (f *File) MMProj() (MMProj, bool) {
	typ, _ := f.KV("general.type")
	t, _ := typ.String()
	if t != "mmproj" && f.Architecture() != "clip" {
		return MMProj{}, false
	}
	str := func(key string) string { kv, _ := f.KV(key); s, _ := kv.String(); return s }
	flag := func(key string) bool { kv, _ := f.KV(key); b, _ := kv.Value.(bool); return b }
	num := func(key string) uint64 { kv, _ := f.KV(key); n, _ := kv.Uint(); return n }
	m := MMProj{
		Projector: str("clip.projector_type"),
		Vision:    flag("clip.has_vision_encoder"), Audio: flag("clip.has_audio_encoder"),
		Blocks: num("clip.vision.block_count"), EmbeddingLength: num("clip.vision.embedding_length"),
		ProjectionDim: num("clip.vision.projection_dim"), ImageSize: num("clip.vision.image_size"),
		PatchSize: num("clip.vision.patch_size"),
	}
	if m.Projector == "" {
		m.Projector = str("clip.vision.projector_type")
	}
	return m, true
}

// Describe says what the file is in a few words: "mmproj (vision tower):
// qwen3vl_merger projector, 27 blocks of 1152, image 768 px (patch 16),
// projects to 5120".
func (m MMProj) Describe() string {
	enc := "vision tower"
	switch {
	case m.Vision && m.Audio:
		enc = "vision and audio towers"
	case m.Audio:
		enc = "audio tower"
	}
	var parts []string
	if m.Projector != "" {
		parts = append(parts, m.Projector+" projector")
	}
	if m.Blocks > 0 {
		parts = append(parts, itoa(m.Blocks)+" blocks of "+itoa(m.EmbeddingLength))
	}
	if m.ImageSize > 0 {
		parts = append(parts, "image "+itoa(m.ImageSize)+" px (patch "+itoa(m.PatchSize)+")")
	}
	if m.ProjectionDim > 0 {
		parts = append(parts, "projects to "+itoa(m.ProjectionDim))
	}
	if len(parts) == 0 {
		return "mmproj (" + enc + ")"
	}
	return "mmproj (" + enc + "): " + strings.Join(parts, ", ")
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
