package verify

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/safetensors"
)

// bundledQwen35 is the qwen35 reference base with its 15 mtp.* tensors,
// bundled whole by testdata/models (see its PROVENANCE.md).
const bundledQwen35 = "../testdata/models/qwen35-tiny/base"

// materializeGGUF rebuilds a header-only reference GGUF in a temp dir.
func materializeGGUF(t testing.TB, name string) string {
	t.Helper()
	dir := materialize(t, "testdata/reference/gguf")
	return filepath.Join(dir, name)
}

// TestReference runs the acceptance cases of issue 6 on the reference
// data: the qwen35 base and its F16/Q4_K_M/Q6_K GGUFs carry the head, the
// PEFT merge dropped it, qwen3 has none.
func TestReference(t *testing.T) {
	gg := materialize(t, "testdata/reference/gguf")
	cases := []struct {
		name      string
		path      string
		format    Format
		verdict   Verdict
		promised  int
		expected  int
		found     []int
		passPlain bool
		passReq   bool
	}{
		{"qwen35 base", bundledQwen35, FormatSafetensors, OK, 1, 15, []int{0}, true, true},
		{"qwen35 base F16 gguf", filepath.Join(gg, "qwen35-base-F16.gguf"), FormatGGUF, OK, 1, 15, []int{4}, true, true},
		{"qwen35 base Q4_K_M gguf", filepath.Join(gg, "qwen35-base-Q4_K_M.gguf"), FormatGGUF, OK, 1, 15, []int{4}, true, true},
		{"qwen35 base Q6_K gguf", filepath.Join(gg, "qwen35-base-Q6_K.gguf"), FormatGGUF, OK, 1, 15, []int{4}, true, true},
		{"qwen35 merged_dora", materialize(t, "testdata/reference/qwen35-merged_dora"), FormatSafetensors, Dropped, 1, 15, []int{}, false, false},
		{"qwen3 base", materialize(t, "testdata/reference/qwen3-base"), FormatSafetensors, Absent, 0, 0, nil, true, false},
		{"qwen3 base F16 gguf", filepath.Join(gg, "qwen3-base-F16.gguf"), FormatGGUF, Absent, 0, 0, []int{}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := MTP(c.path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != c.verdict || r.Format != c.format || r.Promised != c.promised || r.Expected != c.expected {
				t.Fatalf("got %s/%s promised %d expected %d, want %s/%s %d %d\n%s", r.Verdict, r.Format, r.Promised, r.Expected, c.verdict, c.format, c.promised, c.expected, describe(r))
			}
			if len(r.FoundLayers) != len(c.found) {
				t.Errorf("found layers %v, want %v", r.FoundLayers, c.found)
			}
			for i := range c.found {
				if r.FoundLayers[i] != c.found[i] {
					t.Errorf("found layers %v, want %v", r.FoundLayers, c.found)
				}
			}
			if r.Pass(false) != c.passPlain || r.Pass(true) != c.passReq {
				t.Errorf("pass %v / with require %v, want %v / %v", r.Pass(false), r.Pass(true), c.passPlain, c.passReq)
			}
			if r.Deep || r.BytesRead != 0 {
				t.Errorf("read tensor bytes without --deep")
			}
			// One definition of the head: what inspect shows is what
			// verify counts (issue 27: verify said 14 where inspect said 15).
			if h := headOf(t, c.path); h.Tensors+h.NextNTensors != r.Present {
				t.Errorf("FindHead/FindGGUFHead count %d head tensors, MTP %d", h.Tensors+h.NextNTensors, r.Present)
			}
		})
	}
}

// headOf is the head inspect shows for path (a GGUF file or a checkpoint).
func headOf(t *testing.T, path string) Head {
	t.Helper()
	if strings.HasSuffix(path, ".gguf") {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(bytes.NewReader(data), int64(len(data)), path)
		if err != nil {
			t.Fatal(err)
		}
		return FindGGUFHead(f)
	}
	ck, err := safetensors.OpenDir(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var names []string
	for _, l := range ck.Tensors() {
		names = append(names, l.Info.Name)
	}
	return FindHead(names, ck.Config)
}

// TestReferenceDetails pins what the reports say on the reference data.
func TestReferenceDetails(t *testing.T) {
	t.Run("dropped names the mtp tensors and the fix", func(t *testing.T) {
		r, err := MTP(materialize(t, "testdata/reference/qwen35-merged_dora"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"mtp.fc.weight", "mtp.layers.0.input_layernorm.weight", "mtp.layers.0.mlp.down_proj.weight",
			"mtp.layers.0.mlp.gate_proj.weight", "mtp.layers.0.mlp.up_proj.weight", "mtp.layers.0.post_attention_layernorm.weight",
			"mtp.layers.0.self_attn.k_norm.weight", "mtp.layers.0.self_attn.k_proj.weight", "mtp.layers.0.self_attn.o_proj.weight",
			"mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.self_attn.v_proj.weight",
			"mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"}
		if len(r.Missing) != len(want) {
			t.Fatalf("missing %v", r.Missing)
		}
		for i := range want {
			if r.Missing[i] != want[i] {
				t.Fatalf("missing %v, want %v", r.Missing, want)
			}
		}
		for _, s := range []string{"ferry merge", "transformers", "mtp_num_hidden_layers = 1"} {
			if !contains(r.Message, s) {
				t.Errorf("message %q lacks %q", r.Message, s)
			}
		}
		if r.TemplateLayer != 3 {
			t.Errorf("template layer %d, want 3 (the full-attention layer)", r.TemplateLayer)
		}
	})
	t.Run("gguf ok lists the nextn tensors", func(t *testing.T) {
		r, err := MTP(materializeGGUF(t, "qwen35-base-F16.gguf"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := reportNames(r, func(t Tensor) bool { return t.Present })
		want := []string{"blk.4.attn_k.weight", "blk.4.attn_k_norm.weight", "blk.4.attn_norm.weight", "blk.4.attn_output.weight",
			"blk.4.attn_q.weight", "blk.4.attn_q_norm.weight", "blk.4.attn_v.weight", "blk.4.ffn_down.weight", "blk.4.ffn_gate.weight",
			"blk.4.ffn_up.weight", "blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight",
			"blk.4.nextn.shared_head_norm.weight", "blk.4.post_attention_norm.weight"}
		if len(got) != len(want) {
			t.Fatalf("present %v", got)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("present %v, want %v", got, want)
			}
		}
		if r.TrunkLayers != 4 || r.BlockCount != 5 || r.TemplateLayer != 3 {
			t.Errorf("trunk %d block_count %d template %d", r.TrunkLayers, r.BlockCount, r.TemplateLayer)
		}
	})
}

// TestReferenceDeep reads the real head bytes: BF16 safetensors and the
// Q4_K_M GGUF (Q4_K, Q6_K and F32 tensors).
func TestReferenceDeep(t *testing.T) {
	for _, p := range []string{bundledQwen35, "testdata/reference/gguf/qwen35-base-Q4_K_M.gguf"} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			r, err := MTP(p, Options{Deep: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != OK || !r.Deep || r.BytesRead == 0 {
				t.Fatalf("verdict %s deep %v read %d\n%s", r.Verdict, r.Deep, r.BytesRead, describe(r))
			}
			types := map[string]bool{}
			for _, tt := range r.Tensors {
				if tt.Present {
					types[tt.DType] = true
					if tt.Deep == "" || contains(tt.Deep, "not checked") {
						t.Errorf("%s (%s): deep %q", tt.Name, tt.DType, tt.Deep)
					}
				}
			}
			t.Logf("types checked: %v, %d bytes", types, r.BytesRead)
		})
	}
	// A sparse copy of the F16 header has an all-zero head: deep says so.
	r, err := MTP(materializeGGUF(t, "qwen35-base-F16.gguf"), Options{Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != Inconsistent || !contains(r.Message, "all zeros") {
		t.Fatalf("zero-filled head: %s", describe(r))
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
