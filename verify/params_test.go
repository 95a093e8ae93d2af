package verify

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/inputerr"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// TestParameters: an MLX directory's parameters are counted as mlx-lm's
// total_parameters counts them (the Hugging Face checkpoint's elements,
// less A_log and dt_bias, which belong to linear_attn, a module with
// submodules), whatever the bits; a Hugging Face checkpoint's are its
// elements; a packed weight the config does not account for is bad input
// naming the file, the tensor and its offset.
func TestParameters(t *testing.T) {
	src := gen(t, testmodel.Qwen35Options{})
	var elements, nonLeaf int64
	func() {
		ck, err := safetensors.OpenDir(src)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		for _, l := range ck.Tensors() {
			elements += l.Info.NumElements()
			if strings.HasSuffix(l.Info.Name, ".A_log") || strings.HasSuffix(l.Info.Name, ".dt_bias") {
				nonLeaf += l.Info.NumElements()
			}
		}
	}()
	if nonLeaf == 0 {
		t.Fatal("the generated Qwen3.5 has no A_log or dt_bias")
	}
	down := "language_model.model.layers.0.mlp.down_proj"
	for _, tc := range []struct {
		name     string
		dir      func(t *testing.T) string
		want     int64
		wantRule string
		wantErr  string
	}{
		{"hugging face", func(t *testing.T) string { return src }, elements, RuleElements, ""},
		{"mlx 4-bit group 32", func(t *testing.T) string { return buildMLX(t, src, mlxOpts{bits: 4, group: 32}) }, elements - nonLeaf, RuleMLX, ""},
		{"mlx 8-bit, a module at 2", func(t *testing.T) string {
			return buildMLX(t, src, mlxOpts{bits: 8, group: 32, override: map[string]int64{down: 2}})
		}, elements - nonLeaf, RuleMLX, ""},
		{"mlx, a weight packed at other bits than the config says", func(t *testing.T) string {
			return buildMLX(t, src, mlxOpts{bits: 4, group: 32, packBits: map[string]int64{down: 8}})
		}, 0, "", down + ".weight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ck, err := safetensors.OpenDir(tc.dir(t))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			n, rule, err := Parameters(ck.Tensors(), ck.Config)
			if tc.wantErr != "" {
				var ie *inputerr.Error
				if !errors.As(err, &ie) || !errors.Is(err, ErrBadMetadata) || ie.Tensor != tc.wantErr || ie.Offset <= 0 || !strings.HasSuffix(ie.Path, ".safetensors") {
					t.Fatalf("err = %v, want bad metadata naming the shard, %s and its offset", err, tc.wantErr)
				}
				return
			}
			if err != nil || n != tc.want || rule != tc.wantRule {
				t.Fatalf("%d parameters (%s), %v; want %d (%s)", n, rule, err, tc.want, tc.wantRule)
			}
		})
	}
}
