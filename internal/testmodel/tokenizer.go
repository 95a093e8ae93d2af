package testmodel

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/ferry-llm/ferry/internal/fsutil"
)

// merges.json holds the 253 BPE merges of the tokenizer in
// ../shared/reference/qwen35/base/tokenizer.json (a byte-level BPE trained
// by the reference data's authors on a synthetic corpus; see
// testdata/PROVENANCE.md). Merge k makes token id 256+k.
//
//go:embed merges.json
var referenceMergesJSON []byte

const minTokenizerVocab = 256 + 3

var specialTokens = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

// byteSymbols returns GPT-2's byte-level alphabet: each byte's printable
// stand-in rune (printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 onwards, in byte order).
func byteSymbols() [256]rune {
	var out [256]rune
	next := rune(256)
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			out[b] = rune(b)
		} else {
			out[b] = next
			next++
		}
	}
	return out
}

// tokenizerVocab builds a valid byte-level BPE vocabulary of exactly
// vocab-3 tokens plus its merges: the 256 byte symbols in code-point order
// (as the tokenizers trainer orders its initial alphabet), then the
// reference merges, then, for larger vocabularies, synthetic merges that
// append a lower-case letter to an earlier merged token.
func tokenizerVocab(vocab int) (tokens []string, merges [][2]string, err error) {
	if vocab < minTokenizerVocab {
		return nil, nil, fmt.Errorf("testmodel: vocab_size %d is too small for a byte-level tokenizer (need >= %d)", vocab, minTokenizerVocab)
	}
	n := vocab - len(specialTokens)
	syms := byteSymbols()
	runes := syms[:]
	sorted := append([]rune(nil), runes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	have := map[string]bool{}
	for _, r := range sorted {
		tokens = append(tokens, string(r))
		have[string(r)] = true
	}
	var ref [][2]string
	if err := json.Unmarshal(referenceMergesJSON, &ref); err != nil {
		return nil, nil, fmt.Errorf("testmodel: embedded merges: %w", err)
	}
	addMerge := func(a, b string) {
		merges = append(merges, [2]string{a, b})
		tokens = append(tokens, a+b)
		have[a+b] = true
	}
	for _, m := range ref {
		if len(tokens) >= n {
			break
		}
		addMerge(m[0], m[1])
	}
	for i := 256; len(tokens) < n; i++ {
		if i >= len(tokens) {
			return nil, nil, fmt.Errorf("testmodel: cannot build %d tokens", n)
		}
		base := tokens[i]
		for c := 'a'; c <= 'z' && len(tokens) < n; c++ {
			if !have[base+string(c)] {
				addMerge(base, string(c))
			}
		}
	}
	return tokens, merges, nil
}

// writeTokenizer writes tokenizer.json (byte-level BPE with the Qwen2 split
// regex and NFC normaliser, laid out like the reference's) and
// tokenizer_config.json (Qwen2Tokenizer, ChatML template), for c's
// vocabulary: BPE tokens, the three ChatML tokens, c's extra special
// tokens, then c's padding rows (not in the tokenizer).
func writeTokenizer(dir string, c Common) error {
	tokens, merges, err := tokenizerVocab(c.VocabSize - c.reserved())
	if err != nil {
		return err
	}
	base := len(tokens)
	specialTokens := append(append([]string(nil), specialTokens...), c.extraTokens...)
	var b bytes.Buffer
	str := func(s string) {
		j, _ := json.Marshal(s)
		b.Write(j)
	}
	b.WriteString(`{"version":"1.0","truncation":null,"padding":null,"added_tokens":[`)
	for i, s := range specialTokens {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"content":`, base+i)
		str(s)
		b.WriteString(`,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}`)
	}
	b.WriteString(`],"normalizer":{"type":"NFC"},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":`)
	str(`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`)
	b.WriteString(`},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},`)
	b.WriteString(`"post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},`)
	b.WriteString(`"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},`)
	b.WriteString(`"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{`)
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte(',')
		}
		str(t)
		b.WriteString(":" + strconv.Itoa(i))
	}
	b.WriteString(`},"merges":[`)
	for i, m := range merges {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('[')
		str(m[0])
		b.WriteByte(',')
		str(m[1])
		b.WriteByte(']')
	}
	b.WriteString(`]}}`)
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return fmt.Errorf("testmodel: tokenizer.json: %w", err)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, "tokenizer.json"), out.Bytes(), 0o644); err != nil {
		return err
	}

	added := map[string]any{}
	for i, s := range specialTokens {
		added[strconv.Itoa(base+i)] = map[string]any{
			"content": s, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true,
		}
	}
	cfg := map[string]any{
		"add_bos_token":                false,
		"add_prefix_space":             false,
		"added_tokens_decoder":         added,
		"additional_special_tokens":    specialTokens[1:],
		"bos_token":                    nil,
		"chat_template":                "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
		"clean_up_tokenization_spaces": false,
		"eos_token":                    "<|im_end|>",
		"errors":                       "replace",
		"model_max_length":             4096,
		"pad_token":                    "<|endoftext|>",
		"split_special_tokens":         false,
		"tokenizer_class":              "Qwen2Tokenizer",
		"unk_token":                    nil,
	}
	return writeJSON(filepath.Join(dir, "tokenizer_config.json"), cfg)
}
