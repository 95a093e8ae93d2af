package convert

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/digest"
	"github.com/ferry-llm/ferry/safetensors"
)

// The Qwen3.5 vision-language checkpoint (testdata/models/qwen35vl) and
// llama-gguf-split's parts of its F16 conversion, known by their sha256
// (gguf/testdata/split: PROVENANCE.md, SHA256SUMS).
const (
	qwen35vlDir = "../../testdata/models/qwen35vl-tiny/base"
	splitSums   = "../testdata/split/SHA256SUMS"
	// convert_hf_to_gguf.py --outtype f16 of it (../shared/reference/qwen35vl/SHA256SUMS).
	qwen35vlF16 = "694db159dfae9b5a0c5a458e5266c0f37ffdc1421c370ac5af9fe2d2064e92b2"
)

func readSplitSums(t *testing.T) map[string]string {
	t.Helper()
	ds, err := digest.ReadSums(splitSums)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for name, d := range ds {
		sums[name] = d.Hex()
	}
	return sums
}

func planVL(t *testing.T, split gguf.SplitOptions) (*safetensors.Checkpoint, *Plan) {
	t.Helper()
	ck, err := safetensors.OpenDir(qwen35vlDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	p, err := NewPlan(ck, Options{OutType: OutF16, Split: split})
	if err != nil {
		t.Fatal(err)
	}
	return ck, p
}

// TestSplitConvertGolden: `ferry gguf convert --split-max-size 2M` of the
// vision-language checkpoint writes, directly, the three parts
// llama-gguf-split --split --split-max-size 2M makes of the converter's
// F16 file (their sha256), with the digests Run reports; unsplit, the
// conversion is that F16 file, and the parts read as one file are too.
func TestSplitConvertGolden(t *testing.T) {
	sums := readSplitSums(t)
	dir := t.TempDir()
	ck, whole := planVL(t, gguf.SplitOptions{})
	res, err := Run(t.Context(), ck, whole, filepath.Join(dir, "base-F16.gguf"), RunOptions{Digest: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(res.Digest[:]); got != qwen35vlF16 {
		t.Fatalf("unsplit conversion: sha256 %s, the converter's %s", got, qwen35vlF16)
	}

	ck, p := planVL(t, gguf.SplitOptions{MaxBytes: 2_000_000})
	out := filepath.Join(dir, "base-F16-size2M.gguf")
	res, err = Run(t.Context(), ck, p, out, RunOptions{Digest: true, Jobs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Files) != 3 {
		t.Fatalf("%d files, want 3", len(res.Files))
	}
	var total int64
	for _, f := range res.Files {
		name := filepath.Base(f.Path)
		want := sums[name]
		if want == "" {
			t.Fatalf("%s: not a part llama-gguf-split wrote", name)
		}
		if got := fileSHA(t, f.Path); got != want {
			t.Errorf("%s: sha256 %s, llama-gguf-split's %s", name, got, want)
		}
		if got := hex.EncodeToString(f.Digest[:]); got != want {
			t.Errorf("%s: Run's digest %s, llama-gguf-split's %s", name, got, want)
		}
		st, _ := os.Stat(f.Path)
		if st.Size() != f.Size {
			t.Errorf("%s: %d bytes, Run says %d", name, st.Size(), f.Size)
		}
		total += f.Size
	}
	if res.Size != total {
		t.Errorf("Run's size %d, the parts hold %d", res.Size, total)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s written beside the parts", out)
	}
	for _, left := range []string{out + ".journal", gguf.PartialPath(res.Files[0].Path)} {
		if _, err := os.Stat(left); err == nil {
			t.Errorf("%s left", left)
		}
	}
	f, err := gguf.Open(res.Files[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, io.NewSectionReader(f.ReaderAt(), 0, f.Size))
	if got := hex.EncodeToString(h.Sum(nil)); got != qwen35vlF16 {
		t.Errorf("the parts read as one file: sha256 %s, want the converter's %s", got, qwen35vlF16)
	}
}

// TestSplitConvertResume: a split conversion interrupted part-way resumes
// from its journal into the same parts; one interrupted while renaming the
// parts (the later ones in place, the first still partial) takes them
// back and finishes.
func TestSplitConvertResume(t *testing.T) {
	sums := readSplitSums(t)
	ck, p := planVL(t, gguf.SplitOptions{MaxBytes: 2_000_000})
	dir := t.TempDir()
	out := filepath.Join(dir, "base-F16-size2M.gguf")
	files := p.Layout.Files(out)
	ctx, cancel := context.WithCancel(t.Context())
	var done atomic.Int32
	_, err := Run(ctx, ck, p, out, RunOptions{Jobs: 1, TensorDone: func(int, string) {
		if done.Add(1) == 40 { // in the second part
			cancel()
		}
	}})
	cancel()
	if err == nil {
		t.Fatal("the interrupted run finished")
	}
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			t.Fatalf("%s is in place after an interrupted run", f)
		}
		if _, err := os.Stat(gguf.PartialPath(f)); err != nil {
			t.Fatalf("no partial part: %v", err)
		}
	}
	res, err := Run(t.Context(), ck, p, out, RunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed == 0 {
		t.Error("the second run resumed no tensor")
	}
	check := func(when string) {
		for _, f := range files {
			if got := fileSHA(t, f); got != sums[filepath.Base(f)] {
				t.Errorf("%s: %s: sha256 %s, want %s", when, filepath.Base(f), got, sums[filepath.Base(f)])
			}
		}
	}
	check("resumed")

	// A commit cut short: parts 2 and 3 renamed, part 1 still partial,
	// the journal still there (as Run leaves them until the rename ends).
	for _, f := range files {
		os.Rename(f, gguf.PartialPath(f))
	}
	j, err := gguf.OpenTensorJournalFiles(out+".journal", files, Stamp(ck, p), false)
	if err != nil {
		t.Fatal(err)
	}
	for i, tp := range p.Tensors {
		j.Done(i, tp.Name)
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	j.Close()
	for _, f := range files[1:] {
		os.Rename(gguf.PartialPath(f), f)
	}
	res, err = Run(t.Context(), ck, p, out, RunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Resumed != len(p.Tensors) {
		t.Errorf("after a cut-short commit: resumed %d of %d tensors", res.Resumed, len(p.Tensors))
	}
	check("after a cut-short commit")
}
