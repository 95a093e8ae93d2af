package convert

import (
	"fmt"
	"slices"
	"strings"
)

// tokenizer.ggml.pre names how llama.cpp splits text before BPE. The
// converter (get_vocab_base_pre) finds it by hashing the token ids the
// tokenizer gives for a fixed probe text, which needs the tokenizer itself;
// ferry identifies the same thing from what decides those ids apart from
// the vocabulary: tokenizer.json's pre_tokenizer (its split regexes and
// byte-level step) and normalizer. The regexes are the "original regex from
// tokenizer.json" each pre type of llama.cpp's llama-vocab.cpp names.
const (
	qwen2SplitRegex  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen35SplitRegex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3SplitRegex = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// knownPre are the pre-tokenizers ferry recognises: the steps of
// tokenizer.json's pre_tokenizer (as preSteps writes them) and the
// normalizer the reference tokenizer has.
var knownPre = []struct {
	name       string
	ref        string // the model whose tokenizer the converter registered
	steps      []string
	normalizer string
}{
	{"qwen2", "Qwen/Qwen1.5-7B, Qwen2, Qwen2.5, Qwen3", []string{split("Isolated", qwen2SplitRegex), byteLevel(false, false)}, "NFC"},
	{"qwen35", "Qwen/Qwen3.5-9B-Instruct", []string{split("Isolated", qwen35SplitRegex), byteLevel(false, false)}, "NFC"},
	{"llama-bpe", "meta-llama/Meta-Llama-3-8B", []string{split("Isolated", llama3SplitRegex), byteLevel(false, false)}, ""},
	{"gpt-2", "openai-community/gpt2", []string{byteLevel(false, true)}, ""},
}

func split(behavior, regex string) string { return "Split(" + behavior + ") " + regex }

func byteLevel(prefixSpace, regex bool) string {
	return fmt.Sprintf("ByteLevel(add_prefix_space=%t, use_regex=%t)", prefixSpace, regex)
}

// detectPre names tokenizer.json's pre-tokenizer. When it is none of
// knownPre the family's default is kept and warn says so; a known
// pre-tokenizer with another normalizer than its reference keeps its name
// (llama.cpp's BPE applies no normalizer) and warn says that.
func detectPre(tj *tokenizerJSON, familyDefault string) (name, warn string) {
	steps := preSteps(tj.PreTokenizer)
	norm := normalizerSteps(tj.Normalizer)
	for _, k := range knownPre {
		if !slices.Equal(steps, k.steps) {
			continue
		}
		if norm != k.normalizer {
			return k.name, fmt.Sprintf("the pre-tokenizer is %s's (tokenizer.ggml.pre %q) but the normalizer is %s, not %s: the converter's token-hash check would not recognise this tokenizer; pass --pre to choose another name",
				k.ref, k.name, orNone(norm), orNone(k.normalizer))
		}
		return k.name, ""
	}
	return familyDefault, fmt.Sprintf("unknown pre-tokenizer %s (normalizer %s): tokenizer.ggml.pre is the family default %q; check how llama.cpp should split this text and pass --pre NAME",
		orNone(strings.Join(steps, " + ")), orNone(norm), familyDefault)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// preSteps flattens a pre_tokenizer into one string per step; the fields
// that only affect offsets (trim_offsets) are left out.
func preSteps(p map[string]any) []string {
	if p == nil {
		return nil
	}
	typ, _ := p["type"].(string)
	switch typ {
	case "Sequence":
		var out []string
		list, _ := p["pretokenizers"].([]any)
		for _, x := range list {
			sub, _ := x.(map[string]any)
			out = append(out, preSteps(sub)...)
		}
		return out
	case "Split":
		pat, _ := p["pattern"].(map[string]any)
		re, isRe := pat["Regex"].(string)
		if !isRe {
			lit, _ := pat["String"].(string)
			re = "literal " + fmt.Sprintf("%q", lit)
		}
		behavior, _ := p["behavior"].(string)
		if inv, _ := p["invert"].(bool); inv {
			behavior += ", invert"
		}
		return []string{split(behavior, re)}
	case "ByteLevel":
		prefix, _ := p["add_prefix_space"].(bool)
		re := true // the tokenizers library's default
		if v, ok := p["use_regex"].(bool); ok {
			re = v
		}
		return []string{byteLevel(prefix, re)}
	}
	return []string{fmt.Sprintf("%v", p)}
}

// normalizerSteps names a normalizer's steps, "" when there is none.
func normalizerSteps(n map[string]any) string {
	if n == nil {
		return ""
	}
	typ, _ := n["type"].(string)
	switch typ {
	case "Sequence":
		var out []string
		list, _ := n["normalizers"].([]any)
		for _, x := range list {
			sub, _ := x.(map[string]any)
			if s := normalizerSteps(sub); s != "" {
				out = append(out, s)
			}
		}
		return strings.Join(out, " + ")
	case "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents":
		return typ
	}
	return fmt.Sprintf("%v", n)
}
