package testmodel

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func readJSONFile(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// TestTokenizerMatchesReference: with vocab 512 the generated tokenizer
// files are, as JSON values, the reference qwen35 tokenizer's.
func TestTokenizerMatchesReference(t *testing.T) {
	dir := t.TempDir()
	if err := writeTokenizer(dir, Common{VocabSize: 512}); err != nil {
		t.Fatal(err)
	}
	for _, f := range [][2]string{
		{"tokenizer.json", "testdata/qwen35_tokenizer.json"},
		{"tokenizer_config.json", "testdata/qwen35_tokenizer_config.json"},
	} {
		got, want := readJSONFile(t, filepath.Join(dir, f[0])), readJSONFile(t, f[1])
		for k := range want {
			if !reflect.DeepEqual(got[k], want[k]) {
				t.Errorf("%s: key %q differs", f[0], k)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d keys, want %d", f[0], len(got), len(want))
		}
	}
}

// TestTokenizerValid: for any vocabulary size the tokenizer is a
// consistent byte-level BPE of exactly vocab_size tokens.
func TestTokenizerValid(t *testing.T) {
	for _, v := range []int{259, 300, 512, 1000, 4096} {
		dir := t.TempDir()
		if err := writeTokenizer(dir, Common{VocabSize: v}); err != nil {
			t.Fatal(err)
		}
		tok := readJSONFile(t, filepath.Join(dir, "tokenizer.json"))
		model := tok["model"].(map[string]any)
		vocab := model["vocab"].(map[string]any)
		added := tok["added_tokens"].([]any)
		if len(vocab)+len(added) != v {
			t.Fatalf("vocab %d: %d tokens + %d added", v, len(vocab), len(added))
		}
		ids := map[int]bool{}
		for _, id := range vocab {
			ids[int(id.(float64))] = true
		}
		for i := 0; i < len(vocab); i++ {
			if !ids[i] {
				t.Fatalf("vocab %d: id %d missing", v, i)
			}
		}
		for i, a := range added {
			if id := int(a.(map[string]any)["id"].(float64)); id != len(vocab)+i {
				t.Errorf("vocab %d: added token %d has id %d", v, i, id)
			}
		}
		merges := model["merges"].([]any)
		if len(merges) != len(vocab)-256 {
			t.Errorf("vocab %d: %d merges for %d tokens", v, len(merges), len(vocab))
		}
		for i, m := range merges {
			p := m.([]any)
			l, r := p[0].(string), p[1].(string)
			lid, lok := vocab[l]
			rid, rok := vocab[r]
			out, ook := vocab[l+r]
			if !lok || !rok || !ook {
				t.Fatalf("vocab %d: merge %d %q+%q has a part or result outside the vocab", v, i, l, r)
			}
			if int(out.(float64)) != 256+i || lid.(float64) >= out.(float64) || rid.(float64) >= out.(float64) {
				t.Fatalf("vocab %d: merge %d ids %v %v -> %v", v, i, lid, rid, out)
			}
		}
		cfg := readJSONFile(t, filepath.Join(dir, "tokenizer_config.json"))
		if _, ok := cfg["added_tokens_decoder"].(map[string]any)[itoa(v-1)]; !ok {
			t.Errorf("vocab %d: tokenizer_config lacks id %d", v, v-1)
		}
	}
	if err := writeTokenizer(t.TempDir(), Common{VocabSize: 258}); err == nil {
		t.Error("vocab 258 accepted")
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
