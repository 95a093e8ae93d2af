package convert

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

// slowTokenizer is how the converter read a tokenizer.json before
// fastTokenizer: encoding/json, the vocabulary and the merges decoded
// again from their raw values.
func slowTokenizer(b []byte) (tj tokenizerJSON, vocab map[string]int64, merges []string, err error) {
	if err = decodeJSONFile("tokenizer.json", b, &tj); err != nil {
		return
	}
	vocab = map[string]int64{}
	dec := json.NewDecoder(bytes.NewReader(tj.Model.Vocab))
	dec.UseNumber()
	if err = dec.Decode(&vocab); err != nil {
		return
	}
	merges, err = parseMerges(tj.Model.Merges)
	return
}

// checkFast fails t unless fastTokenizer, where it reads b, gives what
// slowTokenizer does. It reports whether it read b.
func checkFast(t *testing.T, b []byte) bool {
	t.Helper()
	vocab, merges, reduced, ok := fastTokenizer(b)
	if !ok {
		return false
	}
	var tj tokenizerJSON
	if decodeJSONFile("tokenizer.json", reduced, &tj) != nil {
		return false // read the slow way
	}
	stj, svocab, smerges, err := slowTokenizer(b)
	if err != nil {
		t.Fatalf("fast read %q, the slow way fails: %v", b, err)
	}
	if !reflect.DeepEqual(vocab, svocab) {
		t.Fatalf("%q: vocabulary %v, the slow way %v", b, vocab, svocab)
	}
	if !reflect.DeepEqual(merges, smerges) {
		t.Fatalf("%q: merges %q, the slow way %q", b, merges, smerges)
	}
	tj.Model.Vocab, tj.Model.Merges, stj.Model.Vocab, stj.Model.Merges = nil, nil, nil, nil
	if !reflect.DeepEqual(tj, stj) {
		t.Fatalf("%q: the rest of the document %+v, the slow way %+v", b, tj, stj)
	}
	return true
}

// fastSeeds are documents at the edges of what fastTokenizer reads; want
// says whether it should (false: it leaves them to encoding/json).
var fastSeeds = []struct {
	doc  string
	want bool
}{
	{`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`, true},
	{`{"model":{"type":"BPE","merges":[["a","b"],["a b","c"]],"vocab":{"a":0,"b":1}}}`, true},
	{` {"added_tokens":[{"id":3,"content":"<|x|>","special":true}], "model" : { "vocab" : { } , "merges" : [ ] , "type" : "BPE" } , "decoder":{"type":"ByteLevel"}} trailing`, true},
	{`{"model":{"vocab":{"\u0120a":0,"caf\u00e9":1,"é":2,"\ud83d\ude00":3,"dup":4,"dup":5,"-":-0},"merges":["\u0120 a"]}}`, true},
	{"{\"model\":{\"vocab\":{\"\xff\xfe\":0},\"merges\":[]}}", true},
	{`{"Model":{"vocab":{"a":0},"merges":[]}}`, false},
	{`{"model":{"Vocab":{"a":0},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":0},"merges":[]},"model":{"type":"BPE"}}`, false},
	{`{"\u006dodel":{"vocab":{"a":0},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":0,"b":1.0},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":1e3},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":null},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":99999999999999999999},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":0},"merges":[null]}}`, false},
	{`{"model":{"vocab":{"a":0},"merges":["a b",["a","b"]]}}`, false},
	{`{"model":{"vocab":{"a":0},"merges":[["a","b","c"]]}}`, false},
	{`{"model":{"vocab":{"a":0,},"merges":[]}}`, false},
	{`{"model":{"vocab":{"a":0},"merges":[]},}`, false},
	{`{"model":{"vocab":{"a":0},"merges":[],"type":}}`, false},
	{"{\"model\":{\"vocab\":{\"a\nb\":0},\"merges\":[]}}", false},
	{`{"model":{"vocab":{"a":0}}}`, false},
	{`[{"model":{"vocab":{"a":0},"merges":[]}}]`, false},
	{`{"model":{"vocab":{"a":0},"merges":[]},"x":[1,2,{"y":"}]"}]}`, true},
	{`{"model":{"vocab":{"a":0},"merges":[]},"x":[1,2}`, false},
	{`{"model":{"vocab":{"a":01},"merges":[]}}`, false},
}

// TestFastTokenizer: the documents fastTokenizer reads, it reads as
// encoding/json does; those at its edges it leaves to encoding/json; and
// the tokenizers of checkpoints (the tiny models' trained BPE, the
// reference Qwen3.5-VL files) take the fast way.
func TestFastTokenizer(t *testing.T) {
	for i, s := range fastSeeds {
		if got := checkFast(t, []byte(s.doc)); got != s.want {
			t.Errorf("seed %d %q: read fast %v, want %v", i, s.doc, got, s.want)
		}
	}
	dir := filepath.Join(t.TempDir(), "model")
	if _, err := (testmodel.Qwen35Options{}).Write(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		filepath.Join(dir, "tokenizer.json"),
		// transformers' save of a Qwen3.5-VL tokenizer (mlxpack's
		// reference outputs; PROVENANCE.md there)
		filepath.Join("..", "..", "mlxpack", "testdata", "qwen35vl_mlx", "bf16", "tokenizer.json"),
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !checkFast(t, b) {
			t.Errorf("%s: not read the fast way", p)
		}
		if v, m, _, _ := fastTokenizer(b); len(v) < 100 || len(m) < 10 {
			t.Errorf("%s: %d tokens, %d merges", p, len(v), len(m))
		}
	}
}

// FuzzFastTokenizer: whatever the bytes, fastTokenizer either leaves them
// to encoding/json or gives what encoding/json does.
func FuzzFastTokenizer(f *testing.F) {
	for _, s := range fastSeeds {
		f.Add([]byte(s.doc))
	}
	f.Add([]byte(strings.Repeat(`{"model":`, 50)))
	f.Fuzz(func(t *testing.T, b []byte) {
		checkFast(t, b)
	})
}
