package mlxpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

var testExpertRE = regexp.MustCompile(`^(.*)\.experts\.(\d+)\.(.*)$`)

// qwen35MoE turns a CompressedQwen3MoE into the qwen3_5_moe layout: tensor
// names under model.language_model, the text config nested.
func qwen35MoE(c *testmodel.CompressedCheckpoint) *testmodel.CompressedCheckpoint {
	for _, tn := range c.Tensors {
		if strings.HasPrefix(tn.Name, "model.") {
			tn.Name = "model.language_model." + strings.TrimPrefix(tn.Name, "model.")
		}
	}
	qc := c.Config["quantization_config"]
	text := map[string]any{}
	for k, v := range c.Config {
		if k != "quantization_config" && k != "architectures" {
			text[k] = v
		}
	}
	text["model_type"] = "qwen3_5_moe_text"
	c.Config = map[string]any{
		"architectures":       []any{"Qwen3_5MoeForConditionalGeneration"},
		"model_type":          "qwen3_5_moe",
		"text_config":         text,
		"quantization_config": qc,
		"tie_word_embeddings": false,
	}
	return c
}

func TestRewriteStacksExperts(t *testing.T) {
	q8 := testmodel.CompressedScheme{Bits: 8, GroupSize: 64}
	down8 := map[string]any{"group_size": 64.0, "bits": 8.0}
	cases := []struct {
		name    string
		fixture *testmodel.CompressedCheckpoint
		want    map[string]any
	}{
		{"qwen3_moe-int4-g32", testmodel.CompressedQwen3MoE(30), q4g32},
		{"qwen3_moe-int2-g64", testmodel.CompressedQwen3MoEWith(31, testmodel.CompressedScheme{Bits: 2, GroupSize: 64}, nil), map[string]any{"group_size": 64.0, "bits": 2.0, "mode": "affine"}},
		{"qwen3_moe-mixed", testmodel.CompressedQwen3MoEWith(32, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &q8), map[string]any{
			"group_size": 32.0, "bits": 4.0, "mode": "affine",
			"model.layers.0.mlp.switch_mlp.down_proj": down8,
			"model.layers.1.mlp.switch_mlp.down_proj": down8,
		}},
		{"qwen3_5_moe-mixed", qwen35MoE(testmodel.CompressedQwen3MoEWith(33, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &q8)), map[string]any{
			"group_size": 32.0, "bits": 4.0, "mode": "affine",
			"language_model.model.layers.0.mlp.switch_mlp.down_proj": down8,
			"language_model.model.layers.1.mlp.switch_mlp.down_proj": down8,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, res := rewriteFixture(t, tc.fixture, tc.want)

			// Shard 1 of 4 holds only the embeddings: still a link.
			rewritten := rewrittenFiles(res)
			if first := safetensors.ShardName(1, 4); rewritten[first] || len(rewritten) != 4 {
				t.Errorf("rewritten %v; want shards 2–4 and the index", rewritten)
			}
			checkLinks(t, src, dst, false, rewritten)
			sc, dc := openBoth(t, src, dst)

			// The index names every tensor of the destination shards, in
			// the shard that holds it, and nothing else.
			idx := readJSON(t, filepath.Join(dst, safetensors.IndexName))
			wm := idx["weight_map"].(map[string]any)
			n := 0
			var total int64
			for _, sh := range dc.Shards {
				for _, ti := range sh.Tensors {
					n++
					total += ti.Size()
					if wm[ti.Name] != sh.Name {
						t.Errorf("index maps %s to %v, it is in %s", ti.Name, wm[ti.Name], sh.Name)
					}
				}
			}
			if n != len(wm) {
				t.Errorf("index names %d tensors, the shards hold %d", len(wm), n)
			}
			if got := idx["metadata"].(map[string]any)["total_size"]; got != float64(total) {
				t.Errorf("total_size %v, want %d", got, total)
			}

			// No per-expert name survives; the stacks are there.
			for _, l := range dc.Tensors() {
				if testExpertRE.MatchString(l.Info.Name) || strings.HasSuffix(l.Info.Name, ".weight_scale") {
					t.Errorf("%s survived the rewrite", l.Info.Name)
				}
			}

			packed, experts := checkRewritten(t, sc, dc, true)
			if packed != res.PackedModules || experts != 2*4*3 {
				t.Errorf("checked %d packed modules (%d experts), plan had %d", packed, experts, res.PackedModules)
			}
			checkRerunNoop(t, src, dst)
		})
	}
}

// slice is part i of n equal parts of b.
func slice(b []byte, n, i int) []byte {
	k := len(b) / n
	return b[i*k : (i+1)*k]
}

// The expert order of a stack is the expert index, not the file order:
// a shuffled source gives the same output.
func TestRewriteStackOrder(t *testing.T) {
	a := testmodel.CompressedQwen3MoE(34)
	b := testmodel.CompressedQwen3MoE(34)
	// Reverse the tensors of shard 2 (layer 0, its experts included).
	var idx []int
	for i, tn := range b.Tensors {
		if tn.Shard == 1 {
			idx = append(idx, i)
		}
	}
	for i, j := 0, len(idx)-1; i < j; i, j = i+1, j-1 {
		b.Tensors[idx[i]], b.Tensors[idx[j]] = b.Tensors[idx[j]], b.Tensors[idx[i]]
	}
	read := func(c *testmodel.CompressedCheckpoint) map[string]string {
		src := writeFixture(t, c)
		dst := filepath.Join(t.TempDir(), "mlx")
		if _, err := repack(t, src, dst, Options{Rewrite: true}); err != nil {
			t.Fatal(err)
		}
		dc, err := safetensors.OpenDirOptions(dst, safetensors.DirOptions{FollowExternalLinks: true})
		if err != nil {
			t.Fatal(err)
		}
		defer dc.Close()
		out := map[string]string{}
		for _, l := range dc.Tensors() {
			_, data := readTensor(t, dc, l.Info.Name)
			out[l.Info.Name] = fmt.Sprint(l.Info.Shape) + string(data)
		}
		return out
	}
	if ra, rb := read(a), read(b); !reflect.DeepEqual(ra, rb) {
		t.Error("stacks depend on the file order of the experts")
	}
}

func TestRewriteStackRefusals(t *testing.T) {
	editShape := func(c *testmodel.CompressedCheckpoint) {
		// Expert 3 of layer 1's up_proj with a different shape: [32, 64].
		m := "model.layers.1.mlp.experts.3.up_proj."
		for _, n := range []string{"weight_packed", "weight_scale", "weight_shape"} {
			c.Remove(m + n)
		}
		u := make([]uint32, 32*64)
		sc := make([]byte, 32*2*2)
		for i := 0; i < 64; i++ {
			binary.LittleEndian.PutUint16(sc[2*i:], 0x3c00)
		}
		shp := make([]byte, 16)
		binary.LittleEndian.PutUint64(shp, 32)
		binary.LittleEndian.PutUint64(shp[8:], 64)
		c.Tensors = append(c.Tensors,
			&testmodel.CompressedTensor{Name: m + "weight_packed", DType: tensor.I32, Shape: []int64{32, 8}, Data: testmodel.CompressedPack(u, 32, 64, 4), Shard: 3},
			&testmodel.CompressedTensor{Name: m + "weight_scale", DType: tensor.BF16, Shape: []int64{32, 2}, Data: sc, Shard: 3},
			&testmodel.CompressedTensor{Name: m + "weight_shape", DType: tensor.I64, Shape: []int64{2}, Data: shp, Shard: 3},
		)
	}
	cases := []struct {
		name     string
		edit     func(c *testmodel.CompressedCheckpoint)
		sentinel error
		mention  string
		bad      bool
	}{
		{"one expert at other bits", func(c *testmodel.CompressedCheckpoint) {
			// Expert 2's down_proj of layer 0 declared and packed at 8 bits group 64.
			q := testmodel.CompressedQwen3MoEWith(35, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &testmodel.CompressedScheme{Bits: 8, GroupSize: 64})
			c.Config = q.Config
			groups := c.Config["quantization_config"].(map[string]any)["config_groups"].(map[string]any)
			groups["group_1"].(map[string]any)["targets"] = []any{"model.layers.0.mlp.experts.2.down_proj"}
			for _, n := range []string{"weight_packed", "weight_scale", "weight_shape"} {
				name := "model.layers.0.mlp.experts.2.down_proj." + n
				*c.Find(name) = *q.Find(name)
			}
		}, ErrMixed, "switch_mlp.down_proj", true},
		{"expert missing", func(c *testmodel.CompressedCheckpoint) {
			for _, n := range []string{"weight_packed", "weight_scale", "weight_shape"} {
				c.Remove("model.layers.1.mlp.experts.1.gate_proj." + n)
			}
		}, ErrInconsistent, "expert 1", true},
		{"experts beyond num_experts", func(c *testmodel.CompressedCheckpoint) {
			c.Config["num_experts"] = 8
		}, ErrInconsistent, "num_experts is 8", true},
		{"float expert beside packed ones", func(c *testmodel.CompressedCheckpoint) {
			for _, n := range []string{"weight_packed", "weight_scale", "weight_shape"} {
				c.Remove("model.layers.1.mlp.experts.3.up_proj." + n)
			}
			c.Tensors = append(c.Tensors, &testmodel.CompressedTensor{Name: "model.layers.1.mlp.experts.3.up_proj.weight", DType: tensor.BF16, Shape: []int64{64, 64}, Data: make([]byte, 64*64*2), Shard: 3})
		}, ErrMixed, "model.layers.1.mlp.experts.3.up_proj.weight", true},
		{"expert of another shape", editShape, ErrInconsistent, "weight_shape [32 64]", true},
		{"fused experts", func(c *testmodel.CompressedCheckpoint) {
			for _, tn := range c.Tensors {
				tn.Name = strings.Replace(tn.Name, "layers.0.mlp.experts.0.up_proj.", "layers.0.mlp.experts.gate_up_proj.", 1)
			}
		}, errkind.ErrNotBuilt, "fused", false},
		{"family not known to stack", func(c *testmodel.CompressedCheckpoint) {
			c.Config["model_type"] = "qwen2_moe"
		}, errkind.ErrNotBuilt, "qwen3_5_moe, qwen3_moe", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testmodel.CompressedQwen3MoE(36)
			tc.edit(c)
			src := writeFixture(t, c)
			dst := filepath.Join(t.TempDir(), "mlx")
			_, err := repack(t, src, dst, Options{Rewrite: true})
			if !errors.Is(err, tc.sentinel) || isBadInput(err) != tc.bad || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("err = %v; want %v mentioning %q, bad input %v", err, tc.sentinel, tc.mention, tc.bad)
			}
			if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Error("destination written")
			}
		})
	}
}

// A shard left with nothing but experts stacked into an earlier shard is
// refused as not built (an empty or missing shard is no checkpoint).
func TestRewriteShardOfOnlyStackedExperts(t *testing.T) {
	c := testmodel.CompressedQwen3MoE(37)
	for _, n := range []string{"model.norm.weight", "lm_head.weight"} {
		c.Find(n).Shard = 2
	}
	src := writeFixture(t, c)
	dst := filepath.Join(t.TempDir(), "mlx")
	_, err := repack(t, src, dst, Options{Rewrite: true})
	if !errors.Is(err, errkind.ErrNotBuilt) || isBadInput(err) || !strings.Contains(err.Error(), safetensors.ShardName(4, 4)) {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Error("destination written")
	}
}
