package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

var updateFamilies = flag.String("update-families", "", "regenerate testdata/golden/families/*.json from the GGUFs llama.cpp's converter wrote in this directory (see testdata/PROVENANCE.md)")

// familyGoldens are the conversions llama.cpp's convert_hf_to_gguf.py
// (34af94c) made of testmodel.ConverterFamilies, and the options that
// made them. Every one is reproduced byte for byte: the converter copy
// wrote tokenizer.ggml.pre qwen2 for the tiny tokenizers' unknown hash
// (testdata/PROVENANCE.md), and ferry names their pre-tokenizer, Qwen2's
// split regex, qwen2 too.
var familyGoldens = []struct {
	golden, family string
	opts           Options
}{
	{"llama-F16", "llama", Options{OutType: OutF16}},
	{"llama-Q8_0", "llama", Options{OutType: OutQ8_0}},
	{"qwen2-F16", "qwen2", Options{OutType: OutF16}},
	{"qwen35moe-F16", "qwen35moe", Options{OutType: OutF16}},
	{"qwen35moe-BF16", "qwen35moe", Options{OutType: OutBF16}},
	{"qwen3moe-F16", "qwen3moe", Options{OutType: OutF16}},
	{"qwen3moe-Q8_0", "qwen3moe", Options{OutType: OutQ8_0}},
	{"qwen35moe-fused-F16", "qwen35moe-fused", Options{OutType: OutF16}},
	{"qwen35moe-fused-mtp-F16", "qwen35moe-fused", Options{OutType: OutF16, MTPOnly: true}},
	{"qwen35-condgen-F16", "qwen35-condgen", Options{OutType: OutF16}},
	{"qwen35-condgen-mtp-F16", "qwen35-condgen", Options{OutType: OutF16, MTPOnly: true}},
	{"qwen3next-F16", "qwen3next", Options{OutType: OutF16}},
}

// dirDigests is the sha256 of every file in dir, by name.
func dirDigests(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		m[e.Name()] = hex.EncodeToString(s[:])
	}
	return m
}

// TestGoldenFamilies converts each family's regenerated input and compares
// every KV and tensor with the real converter's output for it.
func TestGoldenFamilies(t *testing.T) {
	for _, fg := range familyGoldens {
		t.Run(fg.golden, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), fg.family)
			if _, err := testmodel.ConverterFamilies[fg.family](dir); err != nil {
				t.Fatal(err)
			}
			inputs := dirDigests(t, dir)
			path := filepath.Join("testdata", "golden", "families", fg.golden+".json")
			if *updateFamilies != "" {
				g := dumpGGUF(t, filepath.Join(*updateFamilies, fg.golden+".gguf"), "convert_hf_to_gguf.py (llama.cpp 34af94c) of testmodel.ConverterFamilies[\""+fg.family+"\"]")
				b, _ := json.MarshalIndent(struct {
					*goldenFile
					Inputs map[string]string `json:"inputs"`
				}{g, inputs}, "", " ")
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want := loadGoldenPath(t, path)
			var rec struct {
				Inputs map[string]string `json:"inputs"`
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &rec); err != nil {
				t.Fatal(err)
			}
			var names []string
			for n := range rec.Inputs {
				names = append(names, n)
			}
			sort.Strings(names)
			if len(rec.Inputs) != len(inputs) {
				t.Fatalf("regenerated input has %d files, the golden was made from %d (%v): testmodel changed; rerun the converter (PROVENANCE.md)", len(inputs), len(rec.Inputs), names)
			}
			for _, n := range names {
				if inputs[n] != rec.Inputs[n] {
					t.Fatalf("regenerated input %s has sha256 %s, the golden was made from %s: testmodel changed; rerun the converter (PROVENANCE.md)", n, inputs[n], rec.Inputs[n])
				}
			}
			out, p := convertDir(t, dir, fg.opts, WriteOptions{Jobs: 2})
			if len(p.Warnings) != 0 {
				t.Errorf("plan warnings %q", p.Warnings)
			}
			got := dumpGGUF(t, out, "")
			compareGolden(t, got, want, nil, false)
			wantIdentical(t, got, want, "")
		})
	}
}
