package testmodel

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

type writer interface {
	Write(dir string) (*Model, error)
}

// MTP tensor counts: 4 block-level tensors (fc, norm, two pre-fc norms)
// plus, per layer, 6 attention + 2 norms + the MLP (3 dense; MoE: router,
// 3 per expert (or 2 fused), 3 shared-expert, shared_expert_gate).
const moeMTP = 4 + 8 + 1 + 3*4 + 3 + 1

// families is every generator with small options; the tests below run on
// each.
func families() []struct {
	name string
	w    writer
	arch string
	mtp  int // tensors counted as MTP
} {
	return []struct {
		name string
		w    writer
		arch string
		mtp  int
	}{
		{"llama", LlamaOptions{}, "LlamaForCausalLM", 0},
		{"llama-f32-tied", LlamaOptions{Common{DType: tensor.F32, TieWordEmbeddings: true, Seed: 3}}, "LlamaForCausalLM", 0},
		{"qwen2", Qwen2Options{}, "Qwen2ForCausalLM", 0},
		{"qwen3", Qwen3Options{}, "Qwen3ForCausalLM", 0},
		{"qwen3-f16-tied", Qwen3Options{Common{DType: tensor.F16, TieWordEmbeddings: true}}, "Qwen3ForCausalLM", 0},
		{"qwen35", Qwen35Options{}, "Qwen3_5ForCausalLM", 4 + 11},
		{"qwen35-nomtp-tensors", Qwen35Options{Hybrid: Hybrid{OmitMTPTensors: true}}, "Qwen3_5ForCausalLM", 0},
		{"qwen35-condgen", Qwen35Options{ConditionalGeneration: true}, "Qwen3_5ForConditionalGeneration", 4 + 11},
		{"qwen35-mixed-dtypes", Qwen35Options{Common: Common{DTypeOverrides: map[string]tensor.DType{"A_log": tensor.F32, "norm.weight": tensor.F16}}}, "Qwen3_5ForCausalLM", 4 + 11},
		{"qwen35-repeat-block", Qwen35Options{Common: Common{RepeatBlock: 100, Seed: 11}}, "Qwen3_5ForCausalLM", 4 + 11},
		{"qwen35-2mtp-single", Qwen35Options{Common: Common{MaxShardSize: -1}, Hybrid: Hybrid{MTPLayers: 2}}, "Qwen3_5ForCausalLM", 4 + 2*11},
		{"qwen35moe", Qwen35MoEOptions{}, "Qwen3_5MoeForCausalLM", moeMTP},
		{"qwen35moe-fused", Qwen35MoEOptions{MoE: MoE{FusedExperts: true, FusedMTPExperts: true}}, "Qwen3_5MoeForCausalLM", 4 + 8 + 1 + 2 + 4},
		{"qwen35moe-condgen", Qwen35MoEOptions{ConditionalGeneration: true}, "Qwen3_5MoeForConditionalGeneration", moeMTP},
		{"qwen3next", Qwen3NextOptions{}, "Qwen3NextForCausalLM", moeMTP},
		{"deepseekv3", DeepSeekV3Options{}, "DeepseekV3ForCausalLM", 6 + 7 + 2 + 3*4 + 3 + 2},
	}
}

// TestGeneratorsOpen: every generator's output passes the checkpoint
// checks, and the files hold exactly what the returned Model says.
func TestGeneratorsOpen(t *testing.T) {
	for _, f := range families() {
		t.Run(f.name, func(t *testing.T) {
			dir := t.TempDir()
			m, err := f.w.Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			ck, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			if got := ck.Config.Architecture(); got != f.arch || m.Architecture != f.arch {
				t.Errorf("architecture: config %q, model %q, want %q", got, m.Architecture, f.arch)
			}
			if len(ck.Tensors()) != len(m.Tensors) {
				t.Fatalf("checkpoint has %d tensors, model says %d", len(ck.Tensors()), len(m.Tensors))
			}
			if got := len(m.MTPNames()); got != f.mtp {
				t.Errorf("%d MTP tensors, want %d: %v", got, f.mtp, m.MTPNames())
			}
			if got := ck.Config.MTPLayers(); got != int64(m.MTPLayers) {
				t.Errorf("config MTP layers %d, model %d", got, m.MTPLayers)
			}
			if n, _ := ck.Config.Int("num_hidden_layers"); n != int64(m.NumLayers) {
				t.Errorf("num_hidden_layers %d, model %d", n, m.NumLayers)
			}
			if len(m.Shards) > 1 && ck.Index == nil {
				t.Errorf("%d shards but no index", len(m.Shards))
			}
			for _, mt := range m.Tensors {
				loc, ok := ck.Lookup(mt.Name)
				if !ok {
					t.Fatalf("tensor %q missing", mt.Name)
				}
				if loc.Shard.Name != mt.Shard || loc.Info.DType != mt.DType || !reflect.DeepEqual(loc.Info.Shape, mt.Shape) {
					t.Errorf("%s: file has %s %v in %s, model says %s %v in %s", mt.Name,
						loc.Info.DType, loc.Info.Shape, loc.Shard.Name, mt.DType, mt.Shape, mt.Shard)
				}
				raw, err := io.ReadAll(loc.Section())
				if err != nil {
					t.Fatal(err)
				}
				want, err := m.Values(mt.Name)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]float32, len(want))
				if err := tensor.ToF32(mt.DType, got, raw); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: stored values differ from Model.Values", mt.Name)
				}
			}
			if m.MTPLayers > 0 && len(m.MTPNames()) > 0 {
				last := m.Shards[len(m.Shards)-1]
				for _, n := range m.MTPNames() {
					if tt, _ := m.Lookup(n); tt.Shard != last {
						t.Errorf("MTP tensor %s in %s, want the last shard %s", n, tt.Shard, last)
					}
				}
			}
			if ck.Index != nil {
				if ts, _ := ck.Index.Metadata["total_size"]; fmt.Sprint(ts) != fmt.Sprint(m.TotalSize()) {
					t.Errorf("index total_size %v, want %d", ts, m.TotalSize())
				}
			}
			for _, fn := range m.Files {
				if _, err := os.Stat(filepath.Join(dir, fn)); err != nil {
					t.Errorf("listed file: %v", err)
				}
			}
		})
	}
}

// TestDeterminism: same options and seed give byte-identical directories;
// another seed changes every shard.
func TestDeterminism(t *testing.T) {
	for _, f := range families() {
		t.Run(f.name, func(t *testing.T) {
			a, b := t.TempDir(), t.TempDir()
			if _, err := f.w.Write(a); err != nil {
				t.Fatal(err)
			}
			if _, err := f.w.Write(b); err != nil {
				t.Fatal(err)
			}
			da, db := dirDigest(t, a), dirDigest(t, b)
			if !reflect.DeepEqual(da, db) {
				t.Fatalf("two writes differ:\n%v\n%v", da, db)
			}
		})
	}
	a, b := t.TempDir(), t.TempDir()
	if _, err := (Qwen35Options{Common: Common{Seed: 1}}).Write(a); err != nil {
		t.Fatal(err)
	}
	m, err := (Qwen35Options{Common: Common{Seed: 2}}).Write(b)
	if err != nil {
		t.Fatal(err)
	}
	da, db := dirDigest(t, a), dirDigest(t, b)
	for _, s := range m.Shards {
		if da[s] == db[s] {
			t.Errorf("seeds 1 and 2 give the same %s", s)
		}
	}
	if da["config.json"] != db["config.json"] {
		t.Errorf("config.json depends on the seed")
	}
}

func dirDigest(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(data))
	}
	return out
}

// TestReferenceLayout: generated with the reference's dimensions, the qwen35
// and qwen3 checkpoints have exactly the reference's tensor names, dtypes,
// shapes and shard assignment (extracted into testdata/ from
// ../shared/reference/*/base), the same index totals and shard file sizes,
// and config.json / generation_config.json with the same values.
func TestReferenceLayout(t *testing.T) {
	for _, tc := range []struct {
		golden string
		prefix string
		w      writer
	}{
		{"qwen35_base_tensors.txt", "qwen35", Qwen35Reference()},
		{"qwen3_base_tensors.txt", "qwen3", Qwen3Reference()},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			want, meta := readGolden(t, filepath.Join("testdata", tc.golden))
			dir := t.TempDir()
			m, err := tc.w.Write(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tt := range m.Tensors {
				got = append(got, fmt.Sprintf("%s %s %s %s", tt.Name, tt.DType, shapeString(tt.Shape), tt.Shard))
			}
			sort.Strings(got)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("layout differs from the reference\n got: %s\nwant: %s", strings.Join(got, "\n      "), strings.Join(want, "\n      "))
			}
			if !strings.Contains(meta, fmt.Sprintf("total_size=%d total_parameters=%d", m.TotalSize(), m.TotalParameters())) {
				t.Errorf("totals %d/%d not in golden header %q", m.TotalSize(), m.TotalParameters(), meta)
			}
			// Shard file sizes match too: the same tensors in the same
			// (reference-sorted) order give the same padded header.
			for _, s := range m.Shards {
				st, err := os.Stat(filepath.Join(dir, s))
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf("%s=%d", s, st.Size()); !strings.Contains(meta, want) {
					t.Errorf("shard %s: %d bytes, not as in the reference (%s)", s, st.Size(), meta)
				}
			}
			gotIdx, err := os.ReadFile(filepath.Join(dir, safetensors.IndexName))
			if err != nil {
				t.Fatal(err)
			}
			wantIdx, err := os.ReadFile(filepath.Join("testdata", tc.prefix+"_index.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotIdx, wantIdx) {
				t.Errorf("index differs from the reference's:\n%s", gotIdx)
			}
			for _, f := range []string{"config.json", "generation_config.json"} {
				got := readJSONFile(t, filepath.Join(dir, f))
				want := readJSONFile(t, filepath.Join("testdata", tc.prefix+"_"+f))
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s differs from the reference:\n got %v\nwant %v", f, got, want)
				}
			}
		})
	}
}

func shapeString(s []int64) string {
	p := make([]string, len(s))
	for i, v := range s {
		p[i] = fmt.Sprint(v)
	}
	return strings.Join(p, "x")
}

func readGolden(t *testing.T, path string) (rows []string, meta string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			meta += l
			continue
		}
		if l != "" {
			rows = append(rows, l)
		}
	}
	sort.Strings(rows)
	return rows, meta
}
