package quantize

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/killtest"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// The Qwen3.5 vision-language checkpoint and llama-gguf-split's parts of
// its Q4_K_M file (gguf/testdata/split: --split-max-tensors 20 of
// llama-quantize's base-Q4_K_M.gguf, sha256 below).
const (
	qwen35vlDir   = "../../testdata/models/qwen35vl-tiny/base"
	splitGoldDir  = "../testdata/split"
	qwen35vlQ4KM  = "a6be9aec150715da0448c1813ec4714a4ce929ca9d3a7b2887347d93db94baef"
	q4SplitPrefix = "base-Q4_K_M-t20"
)

// checkGoldenParts compares the files written with llama-gguf-split's
// parts of the same name, byte for byte.
func checkGoldenParts(t *testing.T, files []string) {
	t.Helper()
	if len(files) != 4 {
		t.Fatalf("%d files, want 4: %v", len(files), files)
	}
	for _, f := range files {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(splitGoldDir, filepath.Base(f)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, not llama-gguf-split's (%d bytes)", filepath.Base(f), len(got), len(want))
		}
	}
}

func quantizeSource(t *testing.T, in, out string, o Options) *RunResult {
	t.Helper()
	src, err := OpenSource(in, SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	p, err := src.NewPlan(o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(t.Context(), src.File, p, out, RunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestSplitQuantizeGolden: `ferry quantize … Q4_K_M --split-max-tensors
// 20` writes, directly, the parts llama-gguf-split --split-max-tensors 20
// makes of llama-quantize's Q4_K_M file: from the checkpoint, and from the
// F16 conversion written as a split itself (read through its first
// part); that split F16 quantized unsplit is llama-quantize's file.
func TestSplitQuantizeGolden(t *testing.T) {
	dir := t.TempDir()
	split := Options{FileType: quant.FileQ4_K_M, Split: gguf.SplitOptions{MaxTensors: 20}}
	os.Mkdir(filepath.Join(dir, "ck"), 0o755)
	os.Mkdir(filepath.Join(dir, "f16"), 0o755)
	res := quantizeSource(t, qwen35vlDir, filepath.Join(dir, "ck", q4SplitPrefix+".gguf"), split)
	checkGoldenParts(t, res.Files)

	// The F16 file as a split of three (convert --split-max-size 2M).
	ck, err := safetensors.OpenDir(qwen35vlDir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cp, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16, Split: gguf.SplitOptions{MaxBytes: 2_000_000}})
	if err != nil {
		t.Fatal(err)
	}
	cres, err := convert.Run(t.Context(), ck, cp, filepath.Join(dir, "base-F16.gguf"), convert.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cres.Files) != 3 {
		t.Fatalf("F16 split in %d parts, want 3", len(cres.Files))
	}
	first := cres.Files[0].Path

	res = quantizeSource(t, first, filepath.Join(dir, "f16", q4SplitPrefix+".gguf"), split)
	checkGoldenParts(t, res.Files)

	whole := filepath.Join(dir, "base-Q4_K_M.gguf")
	quantizeSource(t, first, whole, Options{FileType: quant.FileQ4_K_M})
	b, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != qwen35vlQ4KM {
		t.Errorf("Q4_K_M of the split F16: sha256 %x, llama-quantize's %s", s, qwen35vlQ4KM)
	}

	// A part missing: a clear error naming it, nothing written.
	os.Remove(cres.Files[2].Path)
	_, err = OpenSource(first, SourceOptions{})
	var ge *gguf.Error
	if !errors.As(err, &ge) || ge.Path != cres.Files[2].Path || !errors.Is(err, gguf.ErrSplit) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing part: %v", err)
	}
}

// With FERRY_QUANTIZE_SPLIT_CHILD set to IN:OUT the test binary quantizes
// IN to Q8_0 as parts of at most 16 tensors named after OUT (`ferry
// quantize IN OUT Q8_0 --split-max-tensors 16`), recording durable tensors
// every 20 ms, and exits: the split kill test's child.
func init() {
	spec := os.Getenv("FERRY_QUANTIZE_SPLIT_CHILD")
	if spec == "" {
		return
	}
	in, out, _ := strings.Cut(spec, ":")
	if err := childSplit(in, out); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

var splitKillOptions = Options{FileType: quant.FileQ8_0, Split: gguf.SplitOptions{MaxTensors: 16}}

func childSplit(in, out string) error {
	f, err := gguf.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := NewPlan(f, splitKillOptions)
	if err != nil {
		return err
	}
	_, err = Run(context.Background(), f, p, out, RunOptions{Jobs: 2, JournalEvery: 20 * time.Millisecond})
	return err
}

// A split quantization SIGKILLed at 8 random moments, and run again after
// each, ends with the parts of an uninterrupted run; no kill leaves the
// first part (the name a reader opens) in place unless every part is
// whole and right. Some kill must leave a journal the next run resumes
// from (killtest.AtRandom).
func TestSplitKillAtRandomPoints(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a split quantization 8 times; not in -short")
	}
	dir := t.TempDir()
	in := filepath.Join(dir, "in.gguf")
	o := testmodel.GGUFOptions{Seed: 9, Layers: 3, NextN: true, Hidden: 512, FF: 1024, Vocab: 4096, Heads: 4, KVHeads: 2, HeadDim: 128}
	if _, err := o.WriteGGUF(in); err != nil {
		t.Fatal(err)
	}
	child := func(out string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "FERRY_QUANTIZE_SPLIT_CHILD="+in+":"+out)
		return cmd
	}
	refDir := filepath.Join(dir, "ref")
	os.Mkdir(refDir, 0o755)
	start := time.Now()
	if b, err := child(filepath.Join(refDir, "out.gguf")).CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v: %s", err, b)
	}
	full := time.Since(start)
	refs, _ := filepath.Glob(filepath.Join(refDir, "out-*-of-*.gguf"))
	if len(refs) < 3 {
		t.Fatalf("the uninterrupted run wrote %v; want a split", refs)
	}
	want := map[string][]byte{}
	for _, r := range refs {
		want[filepath.Base(r)], _ = os.ReadFile(r)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, uninterrupted run %v, %d parts", seed, full, len(refs))
	rng := rand.New(rand.NewPCG(seed, 0x5b117))
	outDir := filepath.Join(dir, "out")
	os.Mkdir(outDir, 0o755)
	out := filepath.Join(outDir, "out.gguf")
	firstPart := filepath.Join(outDir, filepath.Base(refs[0]))
	clearOut := func() {
		ents, _ := os.ReadDir(outDir)
		for _, e := range ents {
			os.Remove(filepath.Join(outDir, e.Name()))
		}
	}
	durable := func() bool {
		j, err := os.ReadFile(out + ".journal")
		return err == nil && bytes.Contains(j, []byte(`"unit"`))
	}
	killtest.AtRandom(t, 8, full, rng, func() *exec.Cmd { return child(out) }, func(kill int) bool {
		if _, err := os.Stat(firstPart); err != nil {
			return false
		}
		for name, b := range want {
			got, err := os.ReadFile(filepath.Join(outDir, name))
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("kill %d: the first part is in place but %s is not the uninterrupted run's (%v)", kill, name, err)
			}
		}
		clearOut() // finished before the kill: start the next one from nothing
		return true
	}, durable)
	if err := childSplit(in, out); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(outDir)
	if len(ents) != len(want) {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left: %v, want only the %d parts", names, len(want))
	}
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(outDir, name))
		if err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s after 8 kills differs from an uninterrupted run's (%v)", name, err)
		}
	}
}
