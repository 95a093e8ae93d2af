package quantize

import (
	"flag"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
)

var (
	// writeMoE32Input and updateMoE32 are -write-moe-input and -update-moe
	// for TestGoldenMoEZeroCount's model.
	writeMoE32Input = flag.String("write-moe32-input", "", "also write moeZeroModel's checkpoint and F16 GGUF into `DIR`")
	updateMoE32     = flag.String("update-moe32", "", "rewrite testdata/golden's qwen35moe32 dumps from the llama.cpp outputs in `DIR`")
)

// moeZeroModel is moeImatrixModel with 32 experts (2 routed per token) and
// another seed: on llama-imatrix's short calibration of its goldens (48
// tokens) some experts of each layer see no token.
var moeZeroModel = testmodel.Qwen35MoEOptions{
	Common: testmodel.Common{
		Seed: 3205, VocabSize: 512, HiddenSize: 256, IntermediateSize: 512, NumLayers: 2,
		NumHeads: 2, NumKVHeads: 1, HeadDim: 128, MaxShardSize: 4 << 20,
	},
	Hybrid: testmodel.Hybrid{FullAttentionInterval: 2, LinearKeyHeadDim: 64, LinearValueHeadDim: 64, NoMTP: true},
	MoE:    testmodel.MoE{NumExperts: 32, NumExpertsPerTok: 2, MoEIntermediateSize: 256, SharedExpertIntermediateSize: 256},
}

// Experts that saw no token during calibration (testdata/PROVENANCE.md,
// "Zero-count experts"): expert 2 of every blk.0 expert tensor, experts 6
// and 22 of blk.1's. llama-imatrix's GGUF stores their sums and a count of
// 0, which llama-quantize loads as ones; its legacy writer stores them as
// (1 / 1) · ncall, which the legacy loader divides back to ones. ferry's
// output from each matrix is llama-quantize's byte for byte, for every
// type; the .dat's blk.0 ncall is 3, so its blk.0 expert tensors differ
// from the GGUF's there too (and here).
func TestGoldenMoEZeroCount(t *testing.T) {
	for _, format := range []string{"dat", "gguf"} {
		m := openMatrix(t, filepath.Join("..", "imatrix", "testdata", "qwen35moe32-imatrix."+format))
		for name, zero := range map[string][]int{"blk.0.ffn_down_exps.weight": {2}, "blk.1.ffn_gate_exps.weight": {6, 22}} {
			v, ok := m.Lookup(name)
			if !ok || len(v) != 32*256 {
				t.Fatalf("%s: %s has %d values", m.Path(), name, len(v))
			}
			var ones []int
			for e := range 32 {
				if !slices.ContainsFunc(v[e*256:(e+1)*256], func(f float32) bool { return f != 1 }) {
					ones = append(ones, e)
				}
			}
			if !slices.Equal(ones, zero) {
				t.Errorf("%s: %s: experts %v load as all ones, want the zero-count ones %v", m.Path(), name, ones, zero)
			}
		}
	}
	moeGolden(t, moeGoldenSet{
		name: "qwen35moe32-imatrix", model: moeZeroModel, logs: filepath.Join(moeTestdata, "logs", "qwen35moe32"),
		writeInput: *writeMoE32Input, update: *updateMoE32,
	})
}
