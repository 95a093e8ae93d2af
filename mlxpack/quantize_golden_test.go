package mlxpack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
)

var update = flag.Bool("update", false, "regenerate testdata/convert/*.json from ../../shared/reference/mlx/convert (see testdata/PROVENANCE.md)")

// The tiny reference checkpoints, as the repository already holds them
// (verbatim copies of ../shared/reference/{qwen3,qwen35}/base).
const (
	qwen3Base  = "../merge/testdata/reference/qwen3/base"
	qwen35Base = "../testdata/models/qwen35-tiny/base"
)

// goldenDir is a reduced mlx_lm.convert output: every tensor (name,
// dtype, shape, sha256 of its bytes), the index and the config.
type goldenDir struct {
	Source  string          `json:"source"`
	Tensors []goldenTensor  `json:"tensors"`
	Index   json.RawMessage `json:"index_metadata"`
	Config  map[string]any  `json:"config"`
}

type goldenTensor struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	SHA256 string  `json:"sha256"`
}

// dumpDir reduces an MLX directory (model*.safetensors read through the
// index-free glob, as mlx-lm loads them).
func dumpDir(t *testing.T, dir, source string) *goldenDir {
	t.Helper()
	g := &goldenDir{Source: source}
	for name, ot := range readOutputs(t, dir) {
		sum := sha256.Sum256(ot.data)
		g.Tensors = append(g.Tensors, goldenTensor{Name: name, DType: string(ot.dtype), Shape: ot.shape, SHA256: hex.EncodeToString(sum[:])})
	}
	sort.Slice(g.Tensors, func(i, j int) bool { return g.Tensors[i].Name < g.Tensors[j].Name })
	var idx struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, safetensors.IndexName)), &idx); err != nil {
		t.Fatal(err)
	}
	g.Index = idx.Metadata
	if err := json.Unmarshal(mustRead(t, filepath.Join(dir, "config.json")), &g.Config); err != nil {
		t.Fatal(err)
	}
	return g
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// referenceConversions are ../shared/reference/mlx/convert: mlx_lm.convert
// (mlx-lm d78bf58e, MLX 0.32.1) of the tiny references, run on inputs whose
// config.json was patched for mlx-lm (PROVENANCE.md there); ferry reads the
// unpatched originals.
var referenceConversions = []struct {
	name string
	src  string
	opts QuantizeOptions
	// configDiff: config keys where ferry's config differs from mlx-lm's
	// on purpose (and what ferry writes).
	configDiff map[string]any
}{
	{"qwen3_bf16", qwen3Base, QuantizeOptions{}, nil},
	{"qwen3_g64_b4", qwen3Base, QuantizeOptions{Bits: 4, GroupSize: 64}, nil},
	{"qwen3_g64_b8", qwen3Base, QuantizeOptions{Bits: 8, GroupSize: 64}, nil},
	{"qwen3_g32_b4", qwen3Base, QuantizeOptions{Bits: 4, GroupSize: 32}, nil},
	{"qwen35_g64_b4", qwen35Base, QuantizeOptions{Bits: 4, GroupSize: 64}, map[string]any{
		"mtp_num_hidden_layers": json.Number("0"),
		MTPRecordKey:            "*",
	}},
}

func goldenPath(name string) string { return filepath.Join("testdata", "convert", name+".json") }

// TestReferenceConversions: for every mlx_lm.convert output in the shared
// reference set, ferry's output has exactly the same tensors (names,
// dtypes, shapes, bytes), the same index metadata, and the same config
// but for the MTP record (mlx-lm keeps promising a head it dropped).
func TestReferenceConversions(t *testing.T) {
	for _, rc := range referenceConversions {
		t.Run(rc.name, func(t *testing.T) {
			if *update {
				ref := filepath.Join("..", "..", "shared", "reference", "mlx", "convert", rc.name)
				g := dumpDir(t, ref, "../shared/reference/mlx/convert/"+rc.name)
				b, err := json.MarshalIndent(g, "", " ")
				if err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Dir(goldenPath(rc.name)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(goldenPath(rc.name), append(b, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var want goldenDir
			if err := json.Unmarshal(mustRead(t, goldenPath(rc.name)), &want); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "mlx")
			convertTo(t, rc.src, out, rc.opts, QuantizeRunOptions{Jobs: 2})
			got := dumpDir(t, out, "ferry")
			compareTensors(t, want.Tensors, got.Tensors)
			var wi, gi map[string]any
			json.Unmarshal(want.Index, &wi)
			json.Unmarshal(got.Index, &gi)
			if !reflect.DeepEqual(wi, gi) {
				t.Errorf("index metadata = %v, want %v", gi, wi)
			}
			wc, gc := normJSON(want.Config), normJSON(got.Config)
			for k, v := range rc.configDiff {
				if v == "*" {
					if _, ok := gc[k]; !ok {
						t.Errorf("config has no %s", k)
					}
					delete(gc, k)
					continue
				}
				if !reflect.DeepEqual(gc[k], normJSON(map[string]any{k: v})[k]) {
					t.Errorf("config %s = %v, want %v", k, gc[k], v)
				}
				gc[k] = wc[k]
			}
			if !reflect.DeepEqual(wc, gc) {
				for k := range union(wc, gc) {
					if !reflect.DeepEqual(wc[k], gc[k]) {
						t.Errorf("config %s = %v, want %v", k, gc[k], wc[k])
					}
				}
			}
		})
	}
}

func union(a, b map[string]any) map[string]bool {
	u := map[string]bool{}
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

// normJSON makes numbers comparable (json.Number and float64 alike).
func normJSON(m map[string]any) map[string]any {
	b, _ := json.Marshal(m)
	var out map[string]any
	json.Unmarshal(b, &out)
	return out
}

func compareTensors(t *testing.T, want, got []goldenTensor) {
	t.Helper()
	wm := map[string]goldenTensor{}
	for _, w := range want {
		wm[w.Name] = w
	}
	gm := map[string]goldenTensor{}
	for _, g := range got {
		gm[g.Name] = g
		w, ok := wm[g.Name]
		switch {
		case !ok:
			t.Errorf("extra tensor %s %s %v", g.Name, g.DType, g.Shape)
		case w.DType != g.DType || !reflect.DeepEqual(w.Shape, g.Shape):
			t.Errorf("%s: %s %v, want %s %v", g.Name, g.DType, g.Shape, w.DType, w.Shape)
		case w.SHA256 != g.SHA256:
			t.Errorf("%s: bytes differ (sha256 %s, want %s)", g.Name, g.SHA256[:12], w.SHA256[:12])
		}
	}
	for _, w := range want {
		if _, ok := gm[w.Name]; !ok {
			t.Errorf("missing tensor %s %s %v", w.Name, w.DType, w.Shape)
		}
	}
}

func convertTo(t *testing.T, src, out string, opts QuantizeOptions, ro QuantizeRunOptions) *QuantizeResult {
	t.Helper()
	p, err := PlanQuantize(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	res, err := Quantize(context.Background(), p, out, ro)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
