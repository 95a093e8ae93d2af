package convert

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/ggufcheck"
	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/safetensors"
)

var update = flag.Bool("update", false, "regenerate testdata/golden/*.json from ../../../shared/reference (see testdata/PROVENANCE.md)")

// The golden dumps: gguf/internal/goldenfile.
type (
	goldenFile   = goldenfile.File
	goldenKV     = goldenfile.KV
	goldenTensor = goldenfile.Tensor
)

func dumpGGUF(t testing.TB, path, source string) *goldenFile {
	t.Helper()
	g, err := goldenfile.Dump(path, source)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// goldens: the reference GGUFs of ../shared/reference (llama.cpp 34af94c).
var goldens = map[string]string{
	"qwen3-base-F16":  "qwen3/gguf/base-F16.gguf",
	"qwen3-base-Q8_0": "qwen3/gguf/base-Q8_0.gguf",
	"qwen35-base-F16": "qwen35/gguf/base-F16.gguf",
}

func loadGolden(t *testing.T, name string) *goldenFile {
	t.Helper()
	path := filepath.Join("testdata", "golden", name+".json")
	if *update {
		src := filepath.Join("..", "..", "..", "shared", "reference", goldens[name])
		if err := goldenfile.Save(path, dumpGGUF(t, src, "../shared/reference/"+goldens[name])); err != nil {
			t.Fatal(err)
		}
	}
	return loadGoldenPath(t, path)
}

// loadGoldenPath reads a golden dump, its KV values compacted.
func loadGoldenPath(t *testing.T, path string) *goldenFile {
	t.Helper()
	g, err := goldenfile.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// intended lists the KV differences from a golden file that ferry makes on
// purpose, with the reason; compareGolden fails on any other difference.
type intended map[string]string

func convertDir(t *testing.T, dir string, opts Options, wo WriteOptions) (string, *Plan) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := NewPlan(ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.gguf")
	if err := Write(context.Background(), p, out, wo); err != nil {
		t.Fatal(err)
	}
	if err := ggufcheck.Check(out); err != nil {
		t.Fatalf("gguf-parser-go cross-check: %v", err)
	}
	return out, p
}

func compareGolden(t *testing.T, got, want *goldenFile, diffs intended, byName bool) {
	t.Helper()
	wantKV := map[string]goldenKV{}
	for _, kv := range want.KVs {
		wantKV[kv.Key] = kv
	}
	if len(got.KVs) != len(want.KVs) {
		t.Errorf("%d KVs, reference %d", len(got.KVs), len(want.KVs))
	}
	for i, kv := range got.KVs {
		w, ok := wantKV[kv.Key]
		if !byName && i < len(want.KVs) {
			w, ok = want.KVs[i], true
		}
		same := ok && w.Key == kv.Key && w.Type == kv.Type && string(w.Value) == string(kv.Value)
		reason, isIntended := diffs[kv.Key]
		switch {
		case same && isIntended:
			t.Errorf("KV %s: listed as an intended difference (%s) but equal to the reference", kv.Key, reason)
		case !same && isIntended:
			t.Logf("intended difference %s: ours %s %.60s, reference %s %.60s (%s)", kv.Key, kv.Type, kv.Value, w.Type, w.Value, reason)
		case !same:
			t.Errorf("KV %d: ours %s %s %.200s, reference %s %s %.200s", i, kv.Key, kv.Type, kv.Value, w.Key, w.Type, w.Value)
		}
	}
	wantT := map[string]goldenTensor{}
	for _, ti := range want.Tensors {
		wantT[ti.Name] = ti
	}
	if len(got.Tensors) != len(want.Tensors) {
		t.Errorf("%d tensors, reference %d", len(got.Tensors), len(want.Tensors))
	}
	for i, ti := range got.Tensors {
		w, ok := wantT[ti.Name]
		if !byName && i < len(want.Tensors) {
			w, ok = want.Tensors[i], true
		}
		if !ok {
			t.Errorf("tensor %s not in the reference", ti.Name)
			continue
		}
		if w.Name != ti.Name || w.Type != ti.Type || fmt.Sprint(w.Dims) != fmt.Sprint(ti.Dims) || w.SHA256 != ti.SHA256 || (!byName && w.Offset != ti.Offset) {
			t.Errorf("tensor %d: ours %s %s %v @%d %s, reference %s %s %v @%d %s", i, ti.Name, ti.Type, ti.Dims, ti.Offset, ti.SHA256[:12], w.Name, w.Type, w.Dims, w.Offset, w.SHA256[:12])
		}
	}
}

const qwen35Dir = "../../testdata/models/qwen35-tiny/base"

// qwen3Dir is the reference qwen3 base, one copy in merge's testdata.
const qwen3Dir = "../../merge/testdata/reference/qwen3/base"

func TestGoldenQwen3F16(t *testing.T) {
	want := loadGolden(t, "qwen3-base-F16")
	out, _ := convertDir(t, qwen3Dir, Options{OutType: OutF16}, WriteOptions{})
	got := dumpGGUF(t, out, "")
	compareGolden(t, got, want, nil, false)
	wantIdentical(t, got, want, "")
}

// wantIdentical fails unless got is the reference file byte for byte.
func wantIdentical(t *testing.T, got, want *goldenFile, what string) {
	t.Helper()
	if got.SHA256 != want.SHA256 {
		t.Errorf("%sfile sha256 %s, reference %s: not byte-identical", what, got.SHA256, want.SHA256)
	} else {
		t.Logf("%swhole file byte-identical to the reference (sha256 %s)", what, got.SHA256)
	}
}

// TestGoldenQwen35F16: the reference was made by a converter copy that
// writes tokenizer.ggml.pre qwen2 for the tiny tokenizer's unknown hash
// (PROVENANCE.md, 'The one change made to the converter'); ferry names the
// tokenizer's pre-tokenizer, Qwen2's split regex, qwen2 as well, although
// the Qwen3.5 family's own tokenizers are qwen35.
func TestGoldenQwen35F16(t *testing.T) {
	want := loadGolden(t, "qwen35-base-F16")
	out, p := convertDir(t, qwen35Dir, Options{OutType: OutF16}, WriteOptions{Jobs: 3})
	got := dumpGGUF(t, out, "")
	compareGolden(t, got, want, nil, false)
	wantIdentical(t, got, want, "")
	if p.MTPLayers != 1 {
		t.Errorf("plan MTP layers %d", p.MTPLayers)
	}
	if len(p.Warnings) != 0 {
		t.Errorf("plan warnings %q", p.Warnings)
	}
}

// convertQ8_0SHA256 is the sha256 of the reference converter's own
// --outtype q8_0 output for qwen3/base (../shared/reference/PROVENANCE.md,
// "Files produced but not shipped": base-q8_0-convert.gguf, 1412000 bytes).
const convertQ8_0SHA256 = "db3643cbe0ec500b142db84741d19ec95bfad47c65e1c475dbaf344eda42dd88"

func TestGoldenQwen3Q8_0(t *testing.T) {
	want := loadGolden(t, "qwen3-base-Q8_0")
	out, _ := convertDir(t, qwen3Dir, Options{OutType: OutQ8_0}, WriteOptions{})
	got := dumpGGUF(t, out, "")
	// base-Q8_0.gguf was written by llama-quantize, which orders tensors by
	// block and moves general.quantization_version and general.file_type
	// to the end; compare by name. Tensor bytes must be identical.
	compareGolden(t, got, want, nil, true)
	if got.SHA256 != convertQ8_0SHA256 {
		t.Errorf("file sha256 %s, the reference converter's q8_0 output is %s", got.SHA256, convertQ8_0SHA256)
	} else {
		t.Logf("whole file byte-identical to convert_hf_to_gguf.py --outtype q8_0 (sha256 %s)", got.SHA256)
	}
	for _, ti := range got.Tensors {
		if !strings.HasSuffix(ti.Name, "norm.weight") && ti.Type != "Q8_0" {
			t.Errorf("%s is %s", ti.Name, ti.Type)
		}
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }

// convertBF16SHA256 is the sha256 of the reference converter's --outtype
// bf16 output for qwen3/base (../shared/reference/PROVENANCE.md, "Files
// produced but not shipped": base-BF16.gguf, 2640800 bytes).
const convertBF16SHA256 = "705901800877439f5d1006039adfdbd90045cad6306d2b4a490f3f5a4e53a7bc"

// --outtype bf16, and auto (which picks bf16 for a bf16 checkpoint), give
// the reference converter's bf16 file byte for byte.
func TestQwen3BF16AndAuto(t *testing.T) {
	for _, ot := range []OutType{OutBF16, OutAuto} {
		out, p := convertDir(t, qwen3Dir, Options{OutType: ot}, WriteOptions{})
		g := dumpGGUF(t, out, "")
		if g.SHA256 != convertBF16SHA256 {
			t.Errorf("--outtype %s: sha256 %s, reference bf16 conversion %s", ot, g.SHA256, convertBF16SHA256)
		}
		if p.FileType != 32 || p.OutType != OutBF16 {
			t.Errorf("--outtype %s: file type %d, resolved %s", ot, p.FileType, p.OutType)
		}
	}
	// f32: every tensor F32 and equal to the widened checkpoint values.
	out, _ := convertDir(t, qwen3Dir, Options{OutType: OutF32}, WriteOptions{})
	f := openGGUF(t, out)
	for _, ti := range f.Tensors {
		if ti.Type != quant.F32 {
			t.Errorf("%s is %s", ti.Name, ti.Type)
		}
	}
	if kv, _ := f.KV("general.file_type"); kv.Value != uint32(0) {
		t.Errorf("file_type %v", kv.Value)
	}
}
