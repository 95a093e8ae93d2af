package convert

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-llm/ferry/gguf"
)

// gguf-py TokenType.
const (
	tokNormal      = 1
	tokControl     = 3
	tokUserDefined = 4
	tokUnused      = 5
)

const maxTokenizerFile = 256 << 20

// tokenizerJSON is the part of tokenizer.json the converter reads.
type tokenizerJSON struct {
	Model struct {
		Type         string          `json:"type"`
		Vocab        json.RawMessage `json:"vocab"`
		Merges       json.RawMessage `json:"merges"`
		ByteFallback *bool           `json:"byte_fallback"`
		IgnoreMerges *bool           `json:"ignore_merges"`
	} `json:"model"`
	AddedTokens []struct {
		ID         int64  `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized bool   `json:"normalized"`
	} `json:"added_tokens"`
	Normalizer    map[string]any `json:"normalizer"`
	PreTokenizer  map[string]any `json:"pre_tokenizer"`
	PostProcessor map[string]any `json:"post_processor"`
	Decoder       map[string]any `json:"decoder"`
}

func readJSONFile(path string, v any) error {
	b, err := readBounded(path)
	if err != nil {
		return err
	}
	return decodeJSONFile(path, b, v)
}

// readBounded reads the file at path, of at most maxTokenizerFile bytes.
func readBounded(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	// Sized from the file (io.ReadAll's doublings cleared 17 MB of a
	// tokenizer.json several times over).
	var size int64
	if fi, err := fh.Stat(); err == nil {
		size = min(max(fi.Size(), 0), maxTokenizerFile)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(fh, maxTokenizerFile+1)); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	if len(b) > maxTokenizerFile {
		return nil, errf(path, "", -1, ErrTokenizer, "over %d bytes", maxTokenizerFile)
	}
	return b, nil
}

// decodeJSONFile decodes the first JSON value of b, the bytes of the file
// at path, into v (numbers as json.Number).
func decodeJSONFile(path string, b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return errf(path, "", dec.InputOffset(), ErrTokenizer, "%v", err)
	}
	return nil
}

// gpt2Vocab writes the keys of TextModel._set_vocab_gpt2: the BPE model,
// the pre-tokenizer name, tokens padded to vocab_size, token types, then
// gguf.SpecialVocab (merges, special ids, add_*_token, chat template).
// What a directory's tokenizer gives is parsed once in a process
// (vocabMemo) and written again from there.
func (m *model) gpt2Vocab(kv *kvList, defaultPre string) error {
	key := vocabKey(m.dir, defaultPre, m.opts.Pre)
	if key == "" {
		return m.parseGPT2Vocab(kv, defaultPre)
	}
	kvs, warnings, err := vocabMemo.do(key, func() ([]gguf.KV, []string, error) {
		var sub kvList
		w0 := len(m.warnings)
		err := m.parseGPT2Vocab(&sub, defaultPre)
		warnings := slices.Clone(m.warnings[w0:])
		m.warnings = m.warnings[:w0]
		// Kept without the directory, which another plan's may differ
		// from: a warning names its file there.
		for i, w := range warnings {
			if rest, ok := strings.CutPrefix(w, m.dir); ok {
				warnings[i] = memoDir + rest
			}
		}
		return sub.list, warnings, err
	})
	if err != nil {
		return err
	}
	for _, x := range kvs {
		kv.add(x)
	}
	for _, w := range warnings {
		if rest, ok := strings.CutPrefix(w, memoDir); ok {
			w = m.dir + rest
		}
		m.warnings = append(m.warnings, w)
	}
	return nil
}

// memoDir stands for the checkpoint directory in a remembered warning.
const memoDir = "\x00dir"

// parseGPT2Vocab is gpt2Vocab without the memo.
func (m *model) parseGPT2Vocab(kv *kvList, defaultPre string) error {
	tokPath := filepath.Join(m.dir, "tokenizer.json")
	if !fileExists(tokPath) {
		return errf(m.dir, "", -1, ErrTokenizer, "no tokenizer.json (a gpt2/BPE tokenizer.json is required)")
	}
	tj, vocab, vocabErr, merges, mergesErr, err := readTokenizer(tokPath)
	if err != nil {
		return err
	}
	if tj.Model.Type != "BPE" {
		return errf(tokPath, "", -1, ErrTokenizer, "model type %q, only BPE tokenizers are supported", tj.Model.Type)
	}
	if vocabErr != nil {
		return vocabErr
	}
	vocabSize, ok := m.int("vocab_size")
	maxID := int64(-1)
	reverse := make(map[int64]string, len(vocab)+len(tj.AddedTokens))
	for tok, id := range vocab {
		if id < 0 {
			return errf(tokPath, "", -1, ErrTokenizer, "token %q has id %d", tok, id)
		}
		reverse[id] = tok
		maxID = max(maxID, id)
	}
	added := map[string]int64{}
	addedByID := map[int64]int{}
	for i, at := range tj.AddedTokens {
		if at.ID < 0 {
			return errf(tokPath, "", -1, ErrTokenizer, "added token %q has id %d", at.Content, at.ID)
		}
		reverse[at.ID] = at.Content
		added[at.Content] = at.ID
		addedByID[at.ID] = i
		maxID = max(maxID, at.ID)
	}
	if !ok {
		vocabSize = int64(len(reverse))
	}
	if maxID >= vocabSize {
		return errf(tokPath, "", -1, ErrTokenizer, "token id %d is not below vocab_size %d", maxID, vocabSize)
	}
	if vocabSize > gguf.MaxArrayLen {
		return errf(m.cfg.Path, "", -1, ErrConfig, "vocab_size %d", vocabSize)
	}
	tokens := make([]string, vocabSize)
	types := make([]int32, vocabSize)
	for i := int64(0); i < vocabSize; i++ {
		tok, ok := reverse[i]
		if !ok {
			tokens[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = tokUnused
			continue
		}
		if _, isAdded := added[tok]; isAdded {
			// Non-normalized added tokens are re-decoded by transformers;
			// for the byte-level BPE tokenizers handled here that is the
			// identity (special tokens are kept whole).
			at := tj.AddedTokens[addedByID[added[tok]]]
			if at.Special || looksSpecial(tok) {
				types[i] = tokControl
			} else {
				tok = strings.ReplaceAll(tok, "\u2581", " ")
				types[i] = tokUserDefined
			}
		} else {
			types[i] = tokNormal
		}
		tokens[i] = tok
	}
	pre := m.opts.Pre
	if pre == "" {
		var warn string
		pre, warn = detectPre(tj, defaultPre)
		if warn != "" {
			m.warnings = append(m.warnings, tokPath+": "+warn)
		}
	}
	kv.add(gguf.Str("tokenizer.ggml.model", "gpt2"))
	kv.add(gguf.Str("tokenizer.ggml.pre", pre))
	kv.add(gguf.Strings("tokenizer.ggml.tokens", tokens))
	kv.add(gguf.I32s("tokenizer.ggml.token_type", types))
	if mergesErr != nil {
		return mergesErr
	}
	return m.specialVocab(kv, tj, merges, vocabSize)
}

// looksSpecial is TextModel.does_token_look_special.
func looksSpecial(t string) bool {
	switch t {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return (strings.HasPrefix(t, "<|") && strings.HasSuffix(t, "|>")) ||
		(strings.HasPrefix(t, "<｜") && strings.HasSuffix(t, "｜>")) ||
		(strings.HasPrefix(t, "<unused") && strings.HasSuffix(t, ">"))
}

// specialVocab is gguf.SpecialVocab(load_merges=True).add_to_gguf for the
// tokenizer.json + tokenizer_config.json + config.json layout.
func (m *model) specialVocab(kv *kvList, tj *tokenizerJSON, merges []string, nVocab int64) error {
	tokPath := filepath.Join(m.dir, "tokenizer.json")
	var err error
	if len(merges) == 0 {
		if merges, err = readMergesTxt(filepath.Join(m.dir, "merges.txt")); err != nil {
			return err
		}
	}
	var lower, strip *bool
	parseNormalizer(tj.Normalizer, &lower, &strip)

	var tc map[string]any
	tcPath := filepath.Join(m.dir, "tokenizer_config.json")
	if fileExists(tcPath) {
		if err := readJSONFile(tcPath, &tc); err != nil {
			return err
		}
	}
	types := []string{"bos", "eos", "unk", "sep", "pad", "cls", "mask"}
	ids := map[string]int64{}
	var idOrder []string
	setID := func(typ string, v any) {
		id, ok := v.(int64)
		if !ok {
			if n, isNum := v.(json.Number); isNum {
				if i, err := n.Int64(); err == nil {
					id, ok = i, true
				}
			}
		}
		if !ok || id < 0 || id >= nVocab {
			return
		}
		if _, dup := ids[typ]; dup {
			return
		}
		ids[typ] = id
		idOrder = append(idOrder, typ)
	}
	addTok := map[string]bool{}
	var addOrder []string
	setAdd := func(typ string, v bool) {
		if _, ok := addTok[typ]; !ok {
			addOrder = append(addOrder, typ)
		}
		addTok[typ] = v
	}
	if tj.PostProcessor != nil {
		procs := []any{tj.PostProcessor}
		if ps, ok := tj.PostProcessor["processors"].([]any); ok {
			procs = ps
		}
		for _, p := range procs {
			pm, _ := p.(map[string]any)
			switch pm["type"] {
			case "RobertaProcessing", "TemplateProcessing":
				return errf(tokPath, "", -1, ErrTokenizer, "post_processor %v is not supported (only ByteLevel-style processors that add no tokens)", pm["type"])
			}
		}
	}
	var chatTemplate any
	if tc != nil {
		var alt any
		if b, err := os.ReadFile(filepath.Join(m.dir, "chat_template.jinja")); err == nil {
			alt = string(b)
			if extra, _ := filepath.Glob(filepath.Join(m.dir, "additional_chat_templates", "*.jinja")); len(extra) > 0 {
				return errf(m.dir, "", -1, ErrTokenizer, "additional_chat_templates are not supported")
			}
		} else if fileExists(filepath.Join(m.dir, "chat_template.json")) {
			var ct map[string]any
			if err := readJSONFile(filepath.Join(m.dir, "chat_template.json"), &ct); err != nil {
				return err
			}
			alt = ct["chat_template"]
		}
		ct, ok := tc["chat_template"]
		if !ok {
			ct = alt
		}
		switch ct.(type) {
		case string:
			chatTemplate = ct
		case []any:
			return errf(tcPath, "", -1, ErrTokenizer, "named chat templates (a list) are not supported")
		}
		for _, typ := range types {
			if b, ok := tc["add_"+typ+"_token"].(bool); ok {
				setAdd(typ, b)
			}
			var content string
			switch e := tc[typ+"_token"].(type) {
			case string:
				content = e
			case map[string]any:
				c, ok := e["content"].(string)
				if !ok {
					continue
				}
				content = c
			default:
				continue
			}
			for _, at := range tj.AddedTokens {
				if at.Content == content {
					setID(typ, at.ID)
					break
				}
			}
		}
	}
	// config.json {typ}_token_id, top level then text_config.
	for _, typ := range types {
		v, ok := m.cfg.Raw[typ+"_token_id"]
		if !ok || v == nil {
			if tcfg, isMap := m.cfg.Raw["text_config"].(map[string]any); isMap {
				v = tcfg[typ+"_token_id"]
			}
		}
		setID(typ, v)
	}

	if len(merges) > 0 {
		kv.add(gguf.Strings("tokenizer.ggml.merges", merges))
	}
	keyOf := map[string]string{"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id", "pad": "padding_token_id", "mask": "mask_token_id"}
	for _, typ := range idOrder {
		k, ok := keyOf[typ]
		if !ok {
			continue // cls has no handler in gguf-py
		}
		kv.add(gguf.U32("tokenizer.ggml."+k, uint32(ids[typ])))
	}
	for _, typ := range addOrder {
		switch typ {
		case "bos", "eos", "sep":
			kv.add(gguf.Bool("tokenizer.ggml.add_"+typ+"_token", addTok[typ]))
		}
	}
	if s, ok := chatTemplate.(string); ok {
		kv.add(gguf.Str("tokenizer.chat_template", s))
	}
	if lower != nil {
		kv.add(gguf.Bool("tokenizer.ggml.normalizer_lowercase", *lower))
	}
	if strip != nil {
		kv.add(gguf.Bool("tokenizer.ggml.normalizer_strip_accents", *strip))
	}
	return nil
}

func parseMerges(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, nil
	}
	var s string
	if json.Unmarshal(list[0], &s) == nil {
		out := make([]string, len(list))
		for i, r := range list {
			if err := json.Unmarshal(r, &out[i]); err != nil {
				return nil, fmt.Errorf("merge %d: %v", i, err)
			}
		}
		return out, nil
	}
	out := make([]string, len(list))
	for i, r := range list {
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("merge %d is not a pair of strings", i)
		}
		for j := range pair {
			pair[j] = strings.ReplaceAll(pair[j], " ", "\u0120")
		}
		out[i] = pair[0] + " " + pair[1]
	}
	return out, nil
}

func readMergesTxt(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil // no merges anywhere: gguf-py warns and writes none
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) > 0 && strings.HasPrefix(strings.TrimSpace(lines[0]), "#") {
		lines = lines[1:]
	}
	var out []string
	for _, l := range lines {
		f := strings.Fields(strings.TrimSpace(l))
		if len(f) == 2 {
			out = append(out, f[0]+" "+f[1])
		}
	}
	return out, nil
}

func parseNormalizer(n map[string]any, lower, strip **bool) {
	if n == nil {
		return
	}
	t := true
	switch n["type"] {
	case "Lowercase":
		*lower = &t
	case "StripAccents":
		*strip = &t
	case "BertNormalizer":
		if v, ok := n["lowercase"].(bool); ok {
			*lower = &v
		}
		if v, ok := n["strip_accents"].(bool); ok {
			*strip = &v
		}
	case "Sequence":
		if list, ok := n["normalizers"].([]any); ok {
			for _, x := range list {
				if mm, ok := x.(map[string]any); ok {
					parseNormalizer(mm, lower, strip)
				}
			}
		}
	}
}
