package convert

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// tokJSON builds the pre_tokenizer and normalizer parts of a
// tokenizer.json.
func tokJSON(t *testing.T, normalizer, preTokenizer string) *tokenizerJSON {
	t.Helper()
	var tj tokenizerJSON
	doc := `{"normalizer":` + normalizer + `,"pre_tokenizer":` + preTokenizer + `}`
	if err := json.Unmarshal([]byte(doc), &tj); err != nil {
		t.Fatal(err)
	}
	return &tj
}

// splitBL is the usual Sequence[Split(regex, Isolated), ByteLevel].
func splitBL(regex string, trim bool) string {
	re, _ := json.Marshal(regex)
	tr, _ := json.Marshal(trim)
	return `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":` + string(re) +
		`},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":` + string(tr) + `,"use_regex":false}]}`
}

func TestDetectPre(t *testing.T) {
	const nfc = `{"type":"NFC"}`
	for _, tc := range []struct {
		name, normalizer, pre, family string
		want                          string
		warn                          string // substring of the warning; "" for none
	}{
		{"qwen2", nfc, splitBL(qwen2SplitRegex, false), "qwen35", "qwen2", ""},
		{"qwen2 trim_offsets", nfc, splitBL(qwen2SplitRegex, true), "llama-bpe", "qwen2", ""},
		{"qwen2 normalizer in a sequence", `{"type":"Sequence","normalizers":[{"type":"NFC"}]}`, splitBL(qwen2SplitRegex, false), "qwen2", "qwen2", ""},
		{"qwen35", nfc, splitBL(qwen35SplitRegex, false), "qwen2", "qwen35", ""},
		{"llama3", "null", splitBL(llama3SplitRegex, true), "qwen2", "llama-bpe", ""},
		{"gpt2", "null", `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}`, "llama-bpe", "gpt-2", ""},
		{"gpt2, use_regex left out", "null", `{"type":"ByteLevel","add_prefix_space":false}`, "llama-bpe", "gpt-2", ""},
		{"llama3 split but NFC", nfc, splitBL(llama3SplitRegex, true), "llama-bpe", "llama-bpe", "normalizer is NFC, not none"},
		{"qwen2 split without its normalizer", "null", splitBL(qwen2SplitRegex, false), "qwen2", "qwen2", "normalizer is none, not NFC"},
		{"unknown regex", nfc, splitBL(`\p{N}{1,3}|\p{L}+|\s+`, false), "qwen35", "qwen35", `unknown pre-tokenizer Split(Isolated) \p{N}{1,3}|\p{L}+|\s+`},
		{"digits first (deepseek-style)", "null", `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}{1,3}"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":` + mustJSON(llama3SplitRegex) + `},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]}`, "qwen2", "qwen2", "unknown pre-tokenizer"},
		{"removed, not isolated", nfc, strings.Replace(splitBL(qwen2SplitRegex, false), "Isolated", "Removed", 1), "qwen2", "qwen2", "Split(Removed)"},
		{"prefix space", "null", `{"type":"ByteLevel","add_prefix_space":true,"use_regex":true}`, "llama-bpe", "llama-bpe", "add_prefix_space=true"},
		{"metaspace", "null", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always"}`, "llama-bpe", "llama-bpe", "Metaspace"},
		{"no pre_tokenizer", nfc, "null", "qwen2", "qwen2", "unknown pre-tokenizer none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, warn := detectPre(tokJSON(t, tc.normalizer, tc.pre), tc.family)
			if got != tc.want {
				t.Errorf("pre %q, want %q (warning %q)", got, tc.want, warn)
			}
			switch {
			case tc.warn == "" && warn != "":
				t.Errorf("warning %q, want none", warn)
			case tc.warn != "" && !strings.Contains(warn, tc.warn):
				t.Errorf("warning %q, want one containing %q", warn, tc.warn)
			}
		})
	}
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// The bundled tokenizers (the reference set's and testmodel's, for every
// family) split with Qwen2's regex after NFC: qwen2, with no warning.
func TestDetectPreBundled(t *testing.T) {
	paths := []string{
		filepath.Join(qwen3Dir, "tokenizer.json"),
		filepath.Join(qwen35Dir, "tokenizer.json"),
	}
	var fams []string
	for f := range testmodel.ConverterFamilies {
		fams = append(fams, f)
	}
	sort.Strings(fams)
	for _, f := range fams {
		dir := filepath.Join(t.TempDir(), f)
		if _, err := testmodel.ConverterFamilies[f](dir); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.Join(dir, "tokenizer.json"))
	}
	for _, p := range paths {
		var tj tokenizerJSON
		if err := readJSONFile(p, &tj); err != nil {
			t.Fatal(err)
		}
		if got, warn := detectPre(&tj, "family-default"); got != "qwen2" || warn != "" {
			t.Errorf("%s: pre %q, warning %q; want qwen2 and none", p, got, warn)
		}
	}
}

// An unknown pre-tokenizer keeps the family's name and the plan carries
// the warning; --pre overrides without one.
func TestPlanWarnsUnknownPre(t *testing.T) {
	dir := t.TempDir()
	if _, err := (testmodel.Qwen35Options{}).Write(dir); err != nil {
		t.Fatal(err)
	}
	tokPath := filepath.Join(dir, "tokenizer.json")
	b, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	doc["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\S+`}, "behavior": "Isolated", "invert": false}
	if b, err = json.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pre, want string
		warned    bool
	}{{"", "qwen35", true}, {"qwen2", "qwen2", false}} {
		out, p := convertDir(t, dir, Options{OutType: OutF16, Pre: tc.pre}, WriteOptions{})
		if kv, _ := openGGUF(t, out).KV("tokenizer.ggml.pre"); kv.Value != tc.want {
			t.Errorf("--pre %q: tokenizer.ggml.pre %v, want %s", tc.pre, kv.Value, tc.want)
		}
		if warned := len(p.Warnings) == 1 && strings.Contains(p.Warnings[0], `unknown pre-tokenizer Split(Isolated) \S+`) && strings.Contains(p.Warnings[0], tokPath); warned != tc.warned {
			t.Errorf("--pre %q: warnings %q", tc.pre, p.Warnings)
		}
	}
}
