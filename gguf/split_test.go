package gguf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/digest"
)

// The reference split (testdata/split, PROVENANCE.md there): llama-gguf-split
// --split --split-max-tensors 20 of ../shared/reference/qwen35vl/gguf/base-Q4_K_M.gguf.
const (
	splitDir = "testdata/split"
	q4Prefix = "base-Q4_K_M-t20"
	// sha256 of the unsplit files (../shared/reference/qwen35vl/SHA256SUMS).
	q4Whole  = "a6be9aec150715da0448c1813ec4714a4ce929ca9d3a7b2887347d93db94baef"
	f16Whole = "694db159dfae9b5a0c5a458e5266c0f37ffdc1421c370ac5af9fe2d2064e92b2"
)

// readSums reads a SHA256SUMS file: name → hex digest.
func readSums(t *testing.T, path string) map[string]string {
	t.Helper()
	ds, err := digest.ReadSums(path)
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for name, d := range ds {
		sums[name] = d.Hex()
	}
	return sums
}

func sha256Of(t *testing.T, r io.Reader) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestParseSplitSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"2M", 2_000_000, false}, {"50G", 50_000_000_000, false}, {"1000M", 1_000_000_000, false},
		{"0M", 0, true}, {"2", 0, true}, {"2K", 0, true}, {"2.5G", 0, true}, {"-1G", 0, true}, {"M", 0, true}, {"2m", 0, true},
		{"99999999999999999G", 0, true},
	} {
		got, err := ParseSplitSize(c.in)
		if c.bad {
			if err == nil || !errors.Is(err, ErrSplitOptions) {
				t.Errorf("%q: %d, %v; want ErrSplitOptions", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.in, got, err, c.want)
		}
	}
}

func TestSplitNames(t *testing.T) {
	if got := SplitName(SplitPrefix("d/base-F16.gguf"), 0, 3); got != "d/base-F16-00001-of-00003.gguf" {
		t.Errorf("SplitName: %s", got)
	}
	prefix, no, count, ok := ParseSplitName("d/x-00002-of-00003.gguf")
	if !ok || prefix != "d/x" || no != 1 || count != 3 {
		t.Errorf("ParseSplitName: %q %d %d %v", prefix, no, count, ok)
	}
	for _, bad := range []string{"x.gguf", "x-00000-of-00003.gguf", "x-00004-of-00003.gguf", "x-1-of-3.gguf", "-00001-of-00001.gguf"} {
		if _, _, _, ok := ParseSplitName(bad); ok {
			t.Errorf("ParseSplitName(%q) ok", bad)
		}
	}
}

// TestSplitGolden: a split written by Writer from the unsplit file read
// back through OpenSplit of llama-gguf-split's parts is byte-identical to
// those parts, and the parts read as one file are the unsplit file.
func TestSplitGolden(t *testing.T) {
	sums := readSums(t, filepath.Join(splitDir, "SHA256SUMS"))
	whole, err := Open(filepath.Join(splitDir, q4Prefix+"-00001-of-00004.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	if len(whole.Parts) != 4 || len(whole.Tensors) != 71 {
		t.Fatalf("%d parts, %d tensors; want 4, 71", len(whole.Parts), len(whole.Tensors))
	}
	if _, ok := whole.KV(KeySplitCount); ok {
		t.Error("the whole file keeps split.count")
	}
	if got := sha256Of(t, io.NewSectionReader(whole.ReaderAt(), 0, whole.Size)); got != q4Whole {
		t.Errorf("the parts read as one file: sha256 %s, base-Q4_K_M.gguf's is %s", got, q4Whole)
	}
	// The tensor in the last part, where Locate says.
	last := whole.Tensors[70]
	path, off := whole.Locate(last)
	if filepath.Base(path) != q4Prefix+"-00004-of-00004.gguf" {
		t.Errorf("Locate %s: %s", last.Name, path)
	}
	pf, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pt, _ := pf.Tensor(last.Name)
	if off != pf.DataOffset+int64(pt.Offset) {
		t.Errorf("Locate offset %d, part says %d", off, pf.DataOffset+int64(pt.Offset))
	}
	pf.Close()

	// Write the split again from the whole file's layout and bytes.
	files, sl := writeSplit(t, filepath.Join(splitDir, q4Prefix+"-00001-of-00004.gguf"), SplitOptions{MaxTensors: 20})
	if len(files) != 4 {
		t.Fatalf("files %v", files)
	}
	var total int64
	for _, f := range files {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(splitDir, filepath.Base(f)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytesEqual(got, want) {
			t.Errorf("%s: %d bytes differ from llama-gguf-split's %d", filepath.Base(f), len(got), len(want))
		}
		if s := sha256Of(t, strings.NewReader(string(got))); s != sums[filepath.Base(f)] {
			t.Errorf("%s: sha256 %s, SHA256SUMS %s", filepath.Base(f), s, sums[filepath.Base(f)])
		}
		total += int64(len(got))
	}
	if total != sl.OutputSize() {
		t.Errorf("OutputSize %d, files hold %d", sl.OutputSize(), total)
	}
}

// writeSplit writes the GGUF at path (a split's first part: the whole
// model) again as a split with o, named q4Prefix in a temporary directory.
func writeSplit(t *testing.T, path string, o SplitOptions) ([]string, *Layout) {
	t.Helper()
	whole, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	specs := make([]TensorSpec, len(whole.Tensors))
	for i, ti := range whole.Tensors {
		specs[i] = TensorSpec{Name: ti.Name, Dims: ti.Dims, Type: ti.Type}
	}
	l, err := PlanLayout(whole.KVs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := l.WithSplit(whole.KVs, o)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), q4Prefix+".gguf")
	w, err := Create(out, sl, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, ti := range whole.Tensors {
		if err := w.WriteTensor(i, whole.Section(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return sl.Files(out), sl
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// TestSplitBySize: the size rule on the F16 reference's tensor table
// (llama-gguf-split --split-max-size 2M: parts of 27, 28 and 16 tensors,
// split_size2M.log), the limit inclusive, a first tensor over it refused.
func TestSplitBySize(t *testing.T) {
	var specs []TensorSpec
	// Sizes chosen so the limit falls exactly on a boundary.
	for i, n := range []uint64{16, 16, 32, 64, 8} { // F32 bytes 64, 64, 128, 256, 32
		specs = append(specs, TensorSpec{Name: string(rune('a' + i)), Dims: []uint64{n}, Type: quant.F32})
	}
	l, err := PlanLayout([]KV{Str("general.architecture", "x")}, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		max   int64
		first []int
	}{
		{128, []int{0, 2, 3, 4, 5}},
		{256, []int{0, 3, 4, 5}},
		{288, []int{0, 3, 5}},
		{1 << 20, []int{0, 5}},
	} {
		sl, err := l.WithSplit(nil, SplitOptions{MaxBytes: c.max})
		if err != nil {
			t.Fatalf("max %d: %v", c.max, err)
		}
		if got := sl.Split.First; !slices.Equal(got, c.first) {
			t.Errorf("max %d: parts start at %v, want %v", c.max, got, c.first)
		}
	}
	if _, err := l.WithSplit(nil, SplitOptions{MaxBytes: 32}); !errors.Is(err, ErrSplitOptions) {
		t.Errorf("a first tensor over the limit: %v", err)
	}
	if _, err := l.WithSplit(nil, SplitOptions{MaxBytes: 1, MaxTensors: 1}); !errors.Is(err, ErrSplitOptions) {
		t.Errorf("both limits: %v", err)
	}
	sl, _ := l.WithSplit(nil, SplitOptions{MaxTensors: 2})
	if !slices.Equal(sl.Split.First, []int{0, 2, 4, 5}) {
		t.Errorf("max 2 tensors: %v", sl.Split.First)
	}
	for i := range specs {
		p, k := sl.Split.Part(i)
		if sl.Split.First[p]+k != i || k < 0 || i >= sl.Split.First[p+1] {
			t.Errorf("Part(%d) = %d, %d", i, p, k)
		}
	}
}

// TestOpenSplitErrors: a missing part, a part of another split, a part
// opened first: each a clear *Error naming the file.
func TestOpenSplitErrors(t *testing.T) {
	src := func(no int) string { return filepath.Join(splitDir, SplitName(q4Prefix, no, 4)) }
	copyTo := func(t *testing.T, dir, from, name string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setup := func(t *testing.T) string {
		dir := t.TempDir()
		for k := range 4 {
			copyTo(t, dir, src(k), SplitName(q4Prefix, k, 4))
		}
		return dir
	}
	first := func(dir string) string { return filepath.Join(dir, SplitName(q4Prefix, 0, 4)) }
	for _, c := range []struct {
		name    string
		breakIt func(t *testing.T, dir string)
		open    func(dir string) string
		file    string // the file the error names
		want    string
	}{
		{"missing part", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, SplitName(q4Prefix, 2, 4))) }, first,
			SplitName(q4Prefix, 2, 4), "part 3 of 4 is missing"},
		{"part in the wrong place", func(t *testing.T, dir string) { copyTo(t, dir, src(1), SplitName(q4Prefix, 2, 4)) }, first,
			SplitName(q4Prefix, 2, 4), "holds part 2, named as part 3"},
		{"part of another split", func(t *testing.T, dir string) {
			other, _ := writeSplit(t, first(dir), SplitOptions{MaxTensors: 30})
			copyTo(t, dir, other[1], SplitName(q4Prefix, 1, 4))
		}, first, SplitName(q4Prefix, 1, 4), "split in 3 parts"},
		{"not a part", func(t *testing.T, dir string) {
			copyTo(t, dir, filepath.Join("testdata", "qwen3-base-Q8_0.gguf"), SplitName(q4Prefix, 3, 4))
		}, first,
			SplitName(q4Prefix, 3, 4), "not a part of a split"},
		{"later part opened", nil, func(dir string) string { return filepath.Join(dir, SplitName(q4Prefix, 1, 4)) },
			SplitName(q4Prefix, 1, 4), "open its first part, " + SplitName(q4Prefix, 0, 4)},
		{"first part renamed", func(t *testing.T, dir string) { os.Rename(first(dir), filepath.Join(dir, "model.gguf")) },
			func(dir string) string { return filepath.Join(dir, "model.gguf") }, "model.gguf", "must be named PREFIX-00001-of-00004.gguf"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := setup(t)
			if c.breakIt != nil {
				c.breakIt(t, dir)
			}
			f, err := Open(c.open(dir))
			if err == nil {
				f.Close()
				t.Fatal("no error")
			}
			var ge *Error
			if !errors.As(err, &ge) || filepath.Base(ge.Path) != c.file || !errors.Is(err, ErrSplit) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v; want an *Error naming %s, ErrSplit, %q", err, c.file, c.want)
			}
		})
	}
}

// A fresh write of an output removes the partial files another plan of it
// left (another number of parts, or unsplit), and no one else's.
func TestSplitRemovesStalePartials(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	for _, name := range []string{"m.gguf.partial", "m-00001-of-00005.gguf.partial", "m-00004-of-00005.gguf.partial", "other-00001-of-00002.gguf.partial", "m-00001-of-00005.gguf"} {
		os.WriteFile(filepath.Join(dir, name), []byte("old"), 0o644)
	}
	specs := []TensorSpec{{"a", []uint64{8}, quant.F32}, {"b", []uint64{8}, quant.F32}}
	l, _ := PlanLayout(nil, specs, 0)
	sl, err := l.WithSplit(nil, SplitOptions{MaxTensors: 1})
	if err != nil {
		t.Fatal(err)
	}
	w, err := Create(out, sl, Options{Resume: true, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	want := []string{"m-00001-of-00002.gguf.partial", "m-00001-of-00005.gguf", "m-00002-of-00002.gguf.partial", "other-00001-of-00002.gguf.partial"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("left %v, want %v", names, want)
	}
}

// Writing a split over an earlier one of the same names: the old first
// part goes before any new part is renamed into place, so a commit cut
// short never leaves an old first part beside new later parts.
func TestSplitOverwritesOldFirstPart(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	specs := []TensorSpec{{"a", []uint64{8}, quant.F32}, {"b", []uint64{8}, quant.F32}}
	start := func(name string) (*Writer, []string) {
		kvs := []KV{Str("general.name", name)}
		l, _ := PlanLayout(kvs, specs, 0)
		sl, err := l.WithSplit(kvs, SplitOptions{MaxTensors: 1})
		if err != nil {
			t.Fatal(err)
		}
		w, err := Create(out, sl, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		for i := range specs {
			if err := w.WriteTensorBytes(i, make([]byte, 32)); err != nil {
				t.Fatal(err)
			}
		}
		return w, sl.Files(out)
	}
	w, files := start("old")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// The new commit fails at its first rename (part 2's name is taken by
	// a directory that is not empty): the old first part is gone already.
	w, _ = start("new")
	os.Remove(files[1])
	os.MkdirAll(filepath.Join(files[1], "x"), 0o755)
	if err := w.Close(); err == nil {
		t.Fatal("the commit did not fail")
	}
	if _, err := os.Stat(files[0]); err == nil {
		t.Error("the old first part still stands after a failed commit of a new split")
	}
	os.RemoveAll(files[1])
	w, files = start("new")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if kv, _ := f.KV("general.name"); kv.Value != "new" {
		t.Errorf("general.name %v", kv.Value)
	}
}
