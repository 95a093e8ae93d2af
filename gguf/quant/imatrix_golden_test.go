package quant_test

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf/internal/goldenfile"
)

// ImatrixGoldens lists the llama-quantize outputs made with an importance
// matrix (llama.cpp 34af94c, `llama-quantize --imatrix imatrix.gguf
// ../gguf/base-F16.gguf base-imatrix-TYPE.gguf TYPE`) kept as dumps in
// testdata/golden/MODEL-imatrix-TYPE.json: the model, then the types. The
// source is ../shared/reference/MODEL/imatrix/base-imatrix-TYPE.gguf; the
// matrices are gguf/imatrix/testdata/MODEL-imatrix.gguf.
var ImatrixGoldens = map[string][]string{
	"qwen3":  {"Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_S", "Q6_K"},
	"qwen35": {"Q2_K", "Q4_K_M"},
}

// TestGoldenImatrix checks the imatrix dumps against the plain dumps of the
// same type: the same tensors (names, types, dims, offsets) and the same
// metadata plus the four quantize.imatrix.* keys at the end, so that a
// quantizer test can take everything but the weighted tensors' bytes from
// what the plain goldens already pin. With -update it first rewrites every
// dump from ../shared/reference.
func TestGoldenImatrix(t *testing.T) {
	for model, types := range ImatrixGoldens {
		for _, typ := range types {
			path := filepath.Join("testdata", "golden", model+"-imatrix-"+typ+".json")
			updateDump(t, path, filepath.Join(model, "imatrix", "base-imatrix-"+typ+".gguf"))
			g, err := goldenfile.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := goldenfile.Load(filepath.Join("testdata", "golden", model+"-base-"+typ+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(g.Source, "base-imatrix-"+typ+".gguf") {
				t.Errorf("%s: source %q", path, g.Source)
			}
			n := len(plain.KVs)
			if len(g.KVs) != n+4 {
				t.Fatalf("%s: %d KVs, the plain %s has %d; want 4 more", path, len(g.KVs), typ, n)
			}
			for i, kv := range plain.KVs {
				if got := g.KVs[i]; got.Key != kv.Key || got.Type != kv.Type || !bytes.Equal(got.Value, kv.Value) {
					t.Errorf("%s: KV %d is %s %s %s, the plain file's %s %s %s", path, i, got.Key, got.Type, got.Value, kv.Key, kv.Type, kv.Value)
				}
			}
			for i, key := range []string{"file", "dataset", "entries_count", "chunks_count"} {
				if got := g.KVs[n+i].Key; got != "quantize.imatrix."+key {
					t.Errorf("%s: KV %d is %s, want quantize.imatrix.%s", path, n+i, got, key)
				}
			}
			if len(g.Tensors) != len(plain.Tensors) {
				t.Fatalf("%s: %d tensors, the plain file has %d", path, len(g.Tensors), len(plain.Tensors))
			}
			weighted := 0
			for i, ti := range g.Tensors {
				p := plain.Tensors[i]
				if ti.Name != p.Name || ti.Type != p.Type || !slices.Equal(ti.Dims, p.Dims) || ti.Offset != p.Offset {
					t.Errorf("%s: tensor %d is %s %s %v at %d, the plain file's %s %s %v at %d", path, i, ti.Name, ti.Type, ti.Dims, ti.Offset, p.Name, p.Type, p.Dims, p.Offset)
				}
				if ti.SHA256 != p.SHA256 {
					weighted++
				}
			}
			if weighted == 0 {
				t.Errorf("%s: every tensor equals the plain file's", path)
			}
		}
	}
}
