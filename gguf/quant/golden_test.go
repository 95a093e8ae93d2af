package quant_test

import (
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/internal/hashing"
)

var update = flag.Bool("update", false, "regenerate testdata/golden/*.json from ../../../shared/reference (see testdata/PROVENANCE.md)")

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
			if *update {
				rel := filepath.Join(model, "gguf", name+".gguf")
				g, err := goldenfile.Dump(filepath.Join("..", "..", "..", "shared", "reference", rel), "../shared/reference/"+filepath.ToSlash(rel))
				if err != nil {
					t.Fatal(err)
				}
				if err := goldenfile.Save(path, g); err != nil {
					t.Fatal(err)
				}
			}
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
