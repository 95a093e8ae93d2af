package ggufcheck_test

// The gguf reader and writer checked against gguf-parser-go. These tests
// live here, not in package gguf, so that gguf's test binary does not link
// gguf-parser-go: `make fuzz-smoke` builds that binary for FuzzReader with
// every dependency coverage-instrumented, and gguf-parser-go brings net/http,
// crypto/tls and x/crypto/ssh (about 55 CPU seconds of instrumented compile
// on a cold cache, for code FuzzReader never runs).

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/internal/ggufcheck"
	"github.com/ferry-llm/ferry/gguf/quant"
)

func TestLlamaCppFileParsesWithGGUFParserGo(t *testing.T) {
	if err := ggufcheck.Check("../../testdata/qwen3-base-Q8_0.gguf"); err != nil {
		t.Fatal(err)
	}
}

func TestWriterOutputParsesWithGGUFParserGo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.gguf")
	layout, err := gguf.PlanLayout([]gguf.KV{
		gguf.Str("general.architecture", "llama"), gguf.U32("general.file_type", 1),
		gguf.Strings("tokenizer.ggml.tokens", []string{"a", "b"}), gguf.I32s("x.sections", []int32{1, 2, 0}),
		gguf.F32("x.eps", 1e-6), gguf.Bool("x.b", false),
	}, []gguf.TensorSpec{
		{Name: "token_embd.weight", Dims: []uint64{64, 2}, Type: quant.F16},
		{Name: "output_norm.weight", Dims: []uint64{64}, Type: quant.F32},
		{Name: "blk.0.q", Dims: []uint64{256, 1}, Type: quant.Q6_K},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := gguf.Create(path, layout, gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, ti := range layout.Tensors {
		if err := w.WriteTensorBytes(i, make([]byte, ti.Size())); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ggufcheck.Check(path); err != nil {
		t.Fatal(err)
	}
}

// GGUF files named in FERRY_GGUFCHECK_FILES (separated by the OS's list
// separator, ':' on Unix) parse with gguf-parser-go as they do with the gguf
// reader: make demo-full checks the pipeline's outputs this way. Without
// the variable there is nothing to check.
func TestFilesParseWithGGUFParserGo(t *testing.T) {
	list := os.Getenv("FERRY_GGUFCHECK_FILES")
	if list == "" {
		t.Skip("FERRY_GGUFCHECK_FILES not set (make demo-full sets it)")
	}
	for _, p := range filepath.SplitList(list) {
		if err := ggufcheck.Check(p); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
