package convert

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// A tokenizer.json is mostly two values: model.vocab, an object of
// 248k token → id members at Qwen3.5's vocabulary, and model.merges, 247k
// pairs. Read through encoding/json (the document scanned whole, then
// each value again from its RawMessage) they took about a second of one
// core, much of it garbage, on the way to every GGUF stage of a pipeline.
//
// fastTokenizer reads those two values itself and leaves the rest of the
// document to encoding/json. It accepts a strict subset of what
// encoding/json accepts and gives what that gives (FuzzFastTokenizer
// compares the two on every input): anything outside the subset — a
// member name escaped, not ASCII, written twice or in another case, a
// null, a number that is not a plain integer, bytes that are not JSON —
// makes ok false, and the caller reads the file the slow way, which says
// what is wrong with it.

// fastTokenizer returns the vocabulary and merges of the tokenizer.json
// bytes b, and b with both values emptied ({} and []) for encoding/json
// to read the rest of it.
func fastTokenizer(b []byte) (vocab map[string]int64, merges []string, reduced []byte, ok bool) {
	s := &fscan{b: b}
	type span struct{ from, to int }
	var vs, ms span
	var haveModel, haveVocab, haveMerges bool
	ok = s.object(func(key string) bool {
		if key != "model" {
			return !strings.EqualFold(key, "model") && s.skip()
		}
		if haveModel {
			return false
		}
		haveModel = true
		return s.object(func(key string) bool {
			from := s.i
			switch {
			case key == "vocab" && !haveVocab:
				haveVocab = true
				vocab, ok = s.vocab()
				vs = span{from, s.i}
				return ok
			case key == "merges" && !haveMerges:
				haveMerges = true
				merges, ok = s.merges()
				ms = span{from, s.i}
				return ok
			case strings.EqualFold(key, "vocab") || strings.EqualFold(key, "merges"):
				return false
			}
			return s.skip()
		})
	})
	if !ok || !haveVocab || !haveMerges {
		return nil, nil, nil, false
	}
	first, second, fv, sv := vs, ms, "{}", "[]"
	if ms.from < vs.from {
		first, second, fv, sv = ms, vs, "[]", "{}"
	}
	reduced = make([]byte, 0, len(b)-(vs.to-vs.from)-(ms.to-ms.from)+4)
	reduced = append(reduced, b[:first.from]...)
	reduced = append(reduced, fv...)
	reduced = append(reduced, b[first.to:second.from]...)
	reduced = append(reduced, sv...)
	reduced = append(reduced, b[second.to:]...)
	return vocab, merges, reduced, true
}

// fscan reads JSON from b at i.
type fscan struct {
	b []byte
	i int
}

func (s *fscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips white space and reports whether the next byte is c, taking
// it if so.
func (s *fscan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// object reads an object, calling member for each member's name with the
// scanner at its value, which member reads. Names must be ASCII without
// escapes.
func (s *fscan) object(member func(key string) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		s.ws()
		from, to, plain, ok := s.str()
		if !ok || !plain || !ascii(s.b[from+1:to-1]) || !s.next(':') {
			return false
		}
		s.ws()
		if !member(string(s.b[from+1 : to-1])) {
			return false
		}
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// str takes the string at i: its span, quotes included, and whether it
// has no escape. A control character in it is not JSON (ok false).
func (s *fscan) str() (from, to int, plain, ok bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, 0, false, false
	}
	from, plain = s.i, true
	for i := s.i + 1; i < len(s.b); i++ {
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return from, i + 1, plain, true
		case c == '\\':
			plain = false
			i++ // the escaped byte; \uXXXX is checked when decoded
		case c < 0x20:
			return 0, 0, false, false
		}
	}
	return 0, 0, false, false
}

// text takes the string at i and returns it as encoding/json decodes it:
// as is when it has no escape and is valid UTF-8, else through
// encoding/json.
func (s *fscan) text() (string, bool) {
	from, to, plain, ok := s.str()
	if !ok {
		return "", false
	}
	raw := s.b[from+1 : to-1]
	if plain && utf8.Valid(raw) {
		return string(raw), true
	}
	var v string
	if json.Unmarshal(s.b[from:to], &v) != nil {
		return "", false
	}
	return v, true
}

// integer takes a JSON integer of at most 18 digits (no fraction or
// exponent: encoding/json refuses those for an int64).
func (s *fscan) integer() (int64, bool) {
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	start := s.i
	var v int64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	n := s.i - start
	if n == 0 || n > 18 || (n > 1 && s.b[start] == '0') {
		return 0, false
	}
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r', ',', '}', ']':
		default:
			return 0, false // a fraction, an exponent, or not JSON
		}
	}
	if neg {
		v = -v
	}
	return v, true
}

// vocab takes model.vocab: an object of token → integer members.
func (s *fscan) vocab() (map[string]int64, bool) {
	if !s.next('{') {
		return nil, false
	}
	// Sized for a document that is mostly this object, at about 64 bytes
	// a member (Qwen3.5's: 17 MB, 248k tokens): growing a map of that
	// many was a third of the read.
	m := make(map[string]int64, min((len(s.b)-s.i)/64, 1<<20))
	if s.next('}') {
		return m, true
	}
	for {
		s.ws()
		tok, ok := s.text()
		if !ok || !s.next(':') {
			return nil, false
		}
		s.ws()
		id, ok := s.integer()
		if !ok {
			return nil, false
		}
		m[tok] = id
		if s.next('}') {
			return m, true
		}
		if !s.next(',') {
			return nil, false
		}
	}
}

// merges takes model.merges as parseMerges reads it: strings ("a b"), or
// pairs of strings joined by a space, a space in either written as Ġ.
// Empty is nil.
func (s *fscan) merges() ([]string, bool) {
	if !s.next('[') {
		return nil, false
	}
	if s.next(']') {
		return nil, true
	}
	s.ws()
	pairs := s.i < len(s.b) && s.b[s.i] == '['
	var out []string
	for {
		s.ws()
		var m string
		if pairs {
			if !s.next('[') {
				return nil, false
			}
			s.ws()
			a, ok := s.text()
			if !ok || !s.next(',') {
				return nil, false
			}
			s.ws()
			b, ok := s.text()
			if !ok || !s.next(']') {
				return nil, false
			}
			m = strings.ReplaceAll(a, " ", "\u0120") + " " + strings.ReplaceAll(b, " ", "\u0120")
		} else {
			var ok bool
			if m, ok = s.text(); !ok {
				return nil, false
			}
		}
		out = append(out, m)
		if s.next(']') {
			return out, true
		}
		if !s.next(',') {
			return nil, false
		}
	}
}

// skip passes over one value, of any kind, without checking it: what it
// passes is left in the reduced document, which encoding/json reads.
func (s *fscan) skip() bool {
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			if _, _, _, ok := s.str(); !ok {
				return false
			}
			if depth == 0 {
				return true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return true // the end of the enclosing value: not this one's
			}
			depth--
			if depth == 0 {
				s.i++
				return true
			}
		case ',':
			if depth == 0 {
				return true
			}
		}
		s.i++
	}
	return false
}

// readTokenizer reads tokenizer.json at path: the document, its
// vocabulary and its merges, each with its own error (reported where the
// converter used to meet it: the vocabulary's after the model type, the
// merges' with the special vocabulary).
func readTokenizer(path string) (tj *tokenizerJSON, vocab map[string]int64, vocabErr error, merges []string, mergesErr error, err error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	if v, m, reduced, ok := fastTokenizer(b); ok {
		var t tokenizerJSON
		if decodeJSONFile(path, reduced, &t) == nil {
			return &t, v, nil, m, nil, nil
		}
	}
	// The slow way: encoding/json's results, and its errors.
	var t tokenizerJSON
	if err := decodeJSONFile(path, b, &t); err != nil {
		return nil, nil, nil, nil, nil, err
	}
	vocab = map[string]int64{}
	dec := json.NewDecoder(bytes.NewReader(t.Model.Vocab))
	dec.UseNumber()
	if err := dec.Decode(&vocab); err != nil {
		vocabErr = errf(path, "", -1, ErrTokenizer, "model.vocab: %v", err)
	}
	if merges, err = parseMerges(t.Model.Merges); err != nil {
		mergesErr = errf(path, "", -1, ErrTokenizer, "model.merges: %v", err)
	}
	return &t, vocab, vocabErr, merges, mergesErr, nil
}
