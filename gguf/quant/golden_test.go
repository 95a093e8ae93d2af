package quant_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

var update = flag.Bool("update", false, "regenerate testdata/golden/*.json from ../../../shared/reference (see testdata/PROVENANCE.md)")

// updateDump, with -update, rewrites the dump at path from the reference
// file rel (relative to ../shared/reference).
func updateDump(t *testing.T, path, rel string) {
	t.Helper()
	if !*update {
		return
	}
	g, err := goldenfile.Dump(filepath.Join("..", "..", "..", "shared", "reference", rel), "../shared/reference/"+filepath.ToSlash(rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := goldenfile.Save(path, g); err != nil {
		t.Fatal(err)
	}
}

// Goldens lists the llama-quantize outputs (llama.cpp 34af94c, no
// imatrix) kept as dumps in testdata/golden, by name: the model, then the
// reference file under ../shared/reference/MODEL/gguf/. Each was made from
// the base-F16.gguf beside it, which testdata holds whole as
// MODEL-base-F16.gguf.
var Goldens = map[string][]string{
	"qwen3": {"base-F16", "base-Q8_0", "base-Q6_K", "base-Q5_K_M", "base-Q5_K_S", "base-Q4_K_M", "base-Q4_K_S",
		"base-Q3_K_L", "base-Q3_K_M", "base-Q3_K_S", "base-Q2_K",
		"base-Q4_K_M-attnv_q8_0-ffndown_q5_k", "base-Q4_K_M-out_q8_0-embd_q8_0", "base-Q4_K_M-pure"},
	"qwen35": {"base-F16", "base-Q6_K", "base-Q5_K_M", "base-Q4_K_M", "base-Q3_K_M", "base-Q2_K"},
}

// TestGoldenData checks the kept inputs against the dumps of the reference
// files they stand for: testdata/MODEL-base-F16.gguf must be, byte for
// byte, the base-F16.gguf llama-quantize read. With -update it first
// rewrites every dump from ../shared/reference.
func TestGoldenData(t *testing.T) {
	for model, names := range Goldens {
		for _, name := range names {
			path := filepath.Join("testdata", "golden", model+"-"+name+".json")
			updateDump(t, path, filepath.Join(model, "gguf", name+".gguf"))
			g, err := goldenfile.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Tensors) == 0 || !strings.HasSuffix(g.Source, name+".gguf") {
				t.Errorf("%s: %d tensors, source %q", path, len(g.Tensors), g.Source)
			}
			if name != "base-F16" {
				continue
			}
			input := filepath.Join("testdata", model+"-base-F16.gguf")
			d, n, err := hashing.File(context.Background(), input, nil)
			if err != nil {
				t.Fatal(err)
			}
			if d.Hex() != g.SHA256 || n != g.Size {
				t.Errorf("%s: sha256 %s (%d bytes), the reference input is %s (%d bytes)", input, d.Hex(), n, g.SHA256, g.Size)
			}
		}
	}
}

var updateFamilies = flag.String("update-families", "", "regenerate testdata/golden/families/*.json from the llama-quantize outputs in this directory (see testdata/PROVENANCE.md)")

// FamilyTypes are the file types llama-quantize was run with on every
// model of testmodel.QuantizerFamilies.
var FamilyTypes = []string{"Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}

// LegacyTypes are the legacy file types llama-quantize was also run with
// on the two reference inputs (testdata/MODEL-base-F16.gguf).
var LegacyTypes = []string{"Q4_0", "Q4_1", "Q5_0", "Q5_1"}

// TestGoldenFamilies checks the family dumps: for every model, its F16
// input and, for every type, either the output's dump or llama-quantize's
// refusal (refused.json: the error line of its log).
func TestGoldenFamilies(t *testing.T) {
	dir := filepath.Join("testdata", "golden", "families")
	refusedPath := filepath.Join(dir, "refused.json")
	if *updateFamilies != "" {
		refused := map[string]string{}
		for model := range testmodel.QuantizerFamilies {
			in := filepath.Join(*updateFamilies, "in", model+"-F16.gguf")
			g, err := goldenfile.Dump(in, "ferry gguf convert --outtype f16 of testmodel.QuantizerFamilies[\""+model+"\"]")
			if err != nil {
				t.Fatal(err)
			}
			if err := goldenfile.Save(filepath.Join(dir, model+"-F16.json"), g); err != nil {
				t.Fatal(err)
			}
			for _, typ := range FamilyTypes {
				out := filepath.Join(*updateFamilies, model+"-"+typ+".gguf")
				if _, err := os.Stat(out); err != nil {
					log, err := os.ReadFile(filepath.Join(*updateFamilies, "quantize_"+model+"-"+typ+".log"))
					if err != nil {
						t.Fatal(err)
					}
					i := bytes.Index(log, []byte("failed to quantize: "))
					if i < 0 {
						t.Fatalf("%s %s: no output and no failure in the log", model, typ)
					}
					refused[model+"-"+typ] = string(bytes.SplitN(log[i:], []byte("\n"), 2)[0])
					continue
				}
				g, err := goldenfile.Dump(out, "llama-quantize (llama.cpp 34af94c) "+model+"-F16.gguf "+typ)
				if err != nil {
					t.Fatal(err)
				}
				if err := goldenfile.Save(filepath.Join(dir, model+"-"+typ+".json"), g); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, model := range []string{"qwen3", "qwen35"} {
			for _, typ := range LegacyTypes {
				g, err := goldenfile.Dump(filepath.Join(*updateFamilies, model+"-"+typ+".gguf"), "llama-quantize (llama.cpp 34af94c) ../shared/reference/"+model+"/gguf/base-F16.gguf "+typ)
				if err != nil {
					t.Fatal(err)
				}
				if err := goldenfile.Save(filepath.Join(dir, model+"-"+typ+".json"), g); err != nil {
					t.Fatal(err)
				}
			}
		}
		b, _ := json.MarshalIndent(refused, "", " ")
		if err := os.WriteFile(refusedPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(refusedPath)
	if err != nil {
		t.Fatal(err)
	}
	var refused map[string]string
	if err := json.Unmarshal(b, &refused); err != nil {
		t.Fatal(err)
	}
	n := 0
	for model := range testmodel.QuantizerFamilies {
		if _, err := goldenfile.Load(filepath.Join(dir, model+"-F16.json")); err != nil {
			t.Error(err)
		}
		for _, typ := range FamilyTypes {
			g, err := goldenfile.Load(filepath.Join(dir, model+"-"+typ+".json"))
			_, isRefused := refused[model+"-"+typ]
			switch {
			case err == nil && isRefused:
				t.Errorf("%s %s: both an output and a refusal", model, typ)
			case err != nil && !isRefused:
				t.Errorf("%s %s: neither an output nor a refusal: %v", model, typ, err)
			case err == nil:
				n++
				if len(g.Tensors) == 0 {
					t.Errorf("%s %s: no tensors", model, typ)
				}
			}
		}
	}
	for _, model := range []string{"qwen3", "qwen35"} {
		for _, typ := range LegacyTypes {
			if _, err := goldenfile.Load(filepath.Join(dir, model+"-"+typ+".json")); err != nil {
				t.Error(err)
			}
		}
	}
	if n+len(refused) != len(testmodel.QuantizerFamilies)*len(FamilyTypes) {
		t.Errorf("%d outputs + %d refusals for %d models × %d types", n, len(refused), len(testmodel.QuantizerFamilies), len(FamilyTypes))
	}
}
