package verify

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// materialize rebuilds a header-only reference directory (see
// testdata/reference/PROVENANCE.md) in a temp dir: config and index copied,
// every *.head extended with zeros to the original size listed in SIZES.
func materialize(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	sizes := readSizes(t, filepath.Join(src, "SIZES"))
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasSuffix(name, ".head"):
			out := filepath.Join(dst, strings.TrimSuffix(name, ".head"))
			if err := os.WriteFile(out, data, 0o644); err != nil {
				t.Fatal(err)
			}
			size, ok := sizes[name]
			if !ok {
				t.Fatalf("%s: no size in SIZES", name)
			}
			if err := os.Truncate(out, size); err != nil {
				t.Fatal(err)
			}
		case name == "SIZES" || name == "PROVENANCE.md":
		default:
			if err := os.WriteFile(filepath.Join(dst, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dst
}

func readSizes(t testing.TB, path string) map[string]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		n, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out[fields[0]] = n
	}
	return out
}

// outTensor is one tensor a rewrite writes.
type outTensor struct {
	name  string
	dtype tensor.DType
	shape []int64
	data  []byte // nil: the source tensor's bytes (same size required)
}

// rewrite copies the checkpoint at src into a new directory, passing every
// tensor through edit (which returns what to write in its place: nothing to
// drop it, itself to keep it, or new tensors) and config.json through
// cfgEdit. Shards keep their grouping (empty ones vanish) and are renumbered;
// the index is rewritten. extra tensors are appended to the last shard.
func rewrite(t testing.TB, src string, edit func(name string, dt tensor.DType, shape []int64) []outTensor, cfgEdit func(map[string]any), extra ...outTensor) string {
	t.Helper()
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dst := t.TempDir()
	var groups [][]outTensor
	var sources []map[string]safetensors.Location
	for _, sh := range ck.Shards {
		var g []outTensor
		srcOf := map[string]safetensors.Location{}
		for _, ti := range sh.Tensors {
			outs := []outTensor{{name: ti.Name, dtype: ti.DType, shape: ti.Shape}}
			if edit != nil {
				outs = edit(ti.Name, ti.DType, ti.Shape)
			}
			for _, o := range outs {
				if o.data == nil {
					srcOf[o.name] = safetensors.Location{Shard: sh, Info: ti}
				}
				g = append(g, o)
			}
		}
		if len(g) > 0 {
			groups = append(groups, g)
			sources = append(sources, srcOf)
		}
	}
	if len(extra) > 0 {
		groups[len(groups)-1] = append(groups[len(groups)-1], extra...)
	}
	weightMap := map[string]string{}
	var total int64
	for i, g := range groups {
		name := safetensors.ShardName(i+1, len(groups))
		specs := make([]safetensors.TensorSpec, len(g))
		for j, o := range g {
			specs[j] = safetensors.TensorSpec{Name: o.name, DType: o.dtype, Shape: o.shape}
			weightMap[o.name] = name
			total += specs[j].Size()
		}
		w, err := safetensors.Create(filepath.Join(dst, name), nil, specs)
		if err != nil {
			t.Fatal(err)
		}
		for j, o := range g {
			var r io.Reader
			if o.data != nil {
				r = bytes.NewReader(o.data)
			} else {
				loc := sources[i][o.name]
				if loc.Info.Size() != specs[j].Size() {
					t.Fatalf("rewrite: %s changes size but has no data", o.name)
				}
				r = loc.Section()
			}
			if err := w.WriteTensor(o.name, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(groups) > 1 {
		if err := safetensors.WriteIndex(dst, weightMap, total, nil); err != nil {
			t.Fatal(err)
		}
	} else if err := os.Rename(filepath.Join(dst, safetensors.ShardName(1, 1)), filepath.Join(dst, safetensors.SingleName)); err != nil {
		t.Fatal(err)
	}
	// config.json, edited.
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var cfg map[string]any
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfgEdit != nil {
		cfgEdit(cfg)
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// keep is the identity edit.
func keep(name string, dt tensor.DType, shape []int64) []outTensor {
	return []outTensor{{name: name, dtype: dt, shape: shape}}
}

// dropIf drops the tensors pred selects.
func dropIf(pred func(string) bool) func(string, tensor.DType, []int64) []outTensor {
	return func(name string, dt tensor.DType, shape []int64) []outTensor {
		if pred(name) {
			return nil
		}
		return keep(name, dt, shape)
	}
}

// pattern is n deterministic nonzero bytes.
func pattern(n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// bf16s encodes v as BF16.
func bf16s(v []float32) []byte {
	b := make([]byte, 2*len(v))
	tensor.F32ToBF16(b, v)
	return b
}

// filled is n BF16 values of x.
func filledBF16(n int64, x float32) []byte {
	v := make([]float32, n)
	for i := range v {
		v[i] = x
	}
	return bf16s(v)
}

func numel(shape []int64) int64 {
	n, _ := tensor.NumElements(shape)
	return n
}

func setBF16NaN(b []byte, i int) {
	binary.LittleEndian.PutUint16(b[2*i:], 0x7FC0)
}

// names lists a report's tensor names with a predicate, sorted.
func reportNames(r *Report, pred func(Tensor) bool) []string {
	var out []string
	for _, t := range r.Tensors {
		if pred(t) {
			out = append(out, t.Name)
		}
	}
	sort.Strings(out)
	return out
}

func describe(r *Report) string {
	j, _ := json.MarshalIndent(struct {
		Verdict  Verdict
		Message  string
		Missing  []string
		Problems []string
		Warnings []string
	}{r.Verdict, r.Message, r.Missing, r.Problems, r.Warnings}, "", "  ")
	return string(j)
}
