package convert

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// planKVs plans dir as the pipeline's f16 stage does and returns the
// plan's metadata.
func planKVs(t *testing.T, dir string) ([]gguf.KV, error) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := NewPlan(ck, Options{OutType: OutF16})
	if err != nil {
		return nil, err
	}
	return p.KVs, nil
}

// tokensOf is the plan's tokenizer.ggml.tokens.
func tokensOf(t *testing.T, kvs []gguf.KV) []string {
	t.Helper()
	for _, kv := range kvs {
		if a, ok := kv.Value.(gguf.Array); ok && kv.Key == "tokenizer.ggml.tokens" {
			if s, ok := a.Values.([]string); ok {
				return s
			}
		}
	}
	t.Fatal("no tokenizer.ggml.tokens in the plan")
	return nil
}

// TestVocabMemo: a tokenizer is parsed once per process for every plan of
// the same files (a directory of links to them too), again when a file
// changes (same size, same name), never remembered when it fails; plans
// of one directory at once wait for one parse; what a remembered parse
// gives is what parsing gives.
func TestVocabMemo(t *testing.T) {
	saved := vocabMemo
	t.Cleanup(func() { vocabMemo = saved })
	parses := func() int {
		vocabMemo.mu.Lock()
		defer vocabMemo.mu.Unlock()
		return vocabMemo.parses
	}

	dir := filepath.Join(t.TempDir(), "model")
	if _, err := (testmodel.Qwen35Options{}).Write(dir); err != nil {
		t.Fatal(err)
	}
	// The same files in another directory (hard links), as a plan and a
	// run of a pipeline stage see them.
	view := filepath.Join(t.TempDir(), "view")
	if err := os.Mkdir(view, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.Link(filepath.Join(dir, e.Name()), filepath.Join(view, e.Name())); err != nil {
			t.Fatal(err)
		}
	}

	// What plans give unremembered (a directory's name is in its
	// metadata: general.name).
	vocabMemo = &memo{max: 0}
	wants := map[string][]gguf.KV{}
	for _, d := range []string{dir, view} {
		if wants[d], err = planKVs(t, d); err != nil {
			t.Fatal(err)
		}
	}
	want := wants[view]

	vocabMemo = &memo{max: 2}
	for i, d := range []string{dir, dir, view} {
		got, err := planKVs(t, d)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, wants[d]) {
			t.Fatalf("plan %d of %s: metadata differs from an unremembered parse", i, d)
		}
	}
	if n := parses(); n != 1 {
		t.Fatalf("three plans of one tokenizer parsed it %d times, want 1", n)
	}

	// Eight plans at once: one parse between them.
	vocabMemo = &memo{max: 2}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := planKVs(t, view)
			if err == nil && !reflect.DeepEqual(got, want) {
				t.Errorf("plan %d at once: metadata differs", i)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := parses(); n != 1 {
		t.Fatalf("eight plans at once parsed the tokenizer %d times, want 1", n)
	}

	// A token renamed in place, the file's size unchanged: parsed again,
	// and the plan has the new token.
	tok := filepath.Join(dir, "tokenizer.json")
	b, err := os.ReadFile(tok)
	if err != nil {
		t.Fatal(err)
	}
	tokens := tokensOf(t, want)
	old := tokens[len(tokens)/2]
	if !bytes.Contains(b, []byte(`"`+old+`"`)) || len(old) < 2 {
		t.Fatalf("token %q not found in %s", old, tok)
	}
	renamed := "Z" + old[1:]
	if err := os.WriteFile(tok, bytes.Replace(b, []byte(`"`+old+`"`), []byte(`"`+renamed+`"`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := planKVs(t, view)
	if err != nil {
		t.Fatal(err)
	}
	if n := parses(); n != 2 {
		t.Fatalf("after tokenizer.json changed: %d parses, want 2", n)
	}
	if g := tokensOf(t, got)[len(tokens)/2]; g != renamed {
		t.Fatalf("after tokenizer.json changed: token %q, want %q", g, renamed)
	}

	// A warning names the tokenizer.json of the directory planned, the
	// parse remembered from another's or not.
	dir2 := filepath.Join(t.TempDir(), "model2")
	if _, err := (testmodel.Qwen35Options{}).Write(dir2); err != nil {
		t.Fatal(err)
	}
	tok2 := filepath.Join(dir2, "tokenizer.json")
	var doc map[string]any
	if b, err := os.ReadFile(tok2); err != nil || json.Unmarshal(b, &doc) != nil {
		t.Fatalf("%s: %v", tok2, err)
	}
	doc["pre_tokenizer"] = map[string]any{"type": "Whitespace"} // not one llama.cpp names
	if b, err := json.Marshal(doc); err != nil || os.WriteFile(tok2, b, 0o644) != nil {
		t.Fatal(err)
	}
	view2 := filepath.Join(t.TempDir(), "view2")
	if err := os.CopyFS(view2, os.DirFS(dir2)); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir2, view2} {
		ck, err := safetensors.OpenDir(d)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewPlan(ck, Options{OutType: OutF16})
		ck.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Warnings) != 1 || !strings.HasPrefix(p.Warnings[0], filepath.Join(d, "tokenizer.json")+": unknown pre-tokenizer") {
			t.Errorf("plan of %s: warnings %q, want one naming its tokenizer.json", d, p.Warnings)
		}
	}
	// What a directory beside the files holds counts: additional chat
	// templates, which the parse refuses beside chat_template.jinja,
	// added after a plan.
	if err := os.WriteFile(filepath.Join(view2, "chat_template.jinja"), []byte("{{messages}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(view2, "additional_chat_templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := planKVs(t, view2); err != nil {
		t.Fatalf("plan with an empty additional_chat_templates: %v", err)
	}
	if err := os.WriteFile(filepath.Join(view2, "additional_chat_templates", "tool.jinja"), []byte("{{x}}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := planKVs(t, view2); err == nil || !strings.Contains(err.Error(), "additional_chat_templates") {
		t.Errorf("plan with additional chat templates: %v, want them refused", err)
	}
	n0 := parses()

	// A broken tokenizer fails every plan; nothing is remembered of it.
	if err := os.WriteFile(tok, []byte(`{"model": {"type": "BPE", "vocab": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := planKVs(t, dir); err == nil {
			t.Fatalf("plan %d of a broken tokenizer.json: no error", i)
		}
	}
	if n := parses() - n0; n != 2 {
		t.Fatalf("two plans of a broken tokenizer: %d parses, want 2", n)
	}
}
