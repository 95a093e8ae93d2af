package verify

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

// mlxOpts shapes a hand-made MLX directory (the layout mlx_lm.convert -q
// writes, mlx.md §1/§3/§5): names after qwen3_5 sanitize
// (language_model.model.*, language_model.mtp.*), every 2-D .weight
// affine-quantized to U32 [out, in·bits/32] plus BF16 scales/biases
// [out, in/group], conv1d moved to [C, K, 1], a "quantization" block.
type mlxOpts struct {
	bits, group int64
	// override: per-module bits written to config.json (mlx-lm's per-layer
	// entries) and used for packing.
	override map[string]int64
	// packBits: per-module bits actually used for packing, when it should
	// disagree with the config.
	packBits    map[string]int64
	hfConv      bool              // keep conv1d in HF layout [C, 1, K]
	unshifted   bool              // MLX conv1d layout but norms left zero-centred
	drop        func(string) bool // drop these (MLX names)
	noCompanion string            // drop this companion tensor
}

func mlxName(name string) string {
	switch {
	case strings.HasPrefix(name, "model."):
		return "language_model." + name
	case strings.HasPrefix(name, "mtp."), name == "lm_head.weight":
		return "language_model." + name
	}
	return name
}

func buildMLX(t *testing.T, src string, o mlxOpts) string {
	t.Helper()
	edit := func(name string, dt tensor.DType, shape []int64) []outTensor {
		n := mlxName(name)
		if o.drop != nil && o.drop(n) {
			return nil
		}
		if strings.HasSuffix(n, "conv1d.weight") {
			if o.hfConv {
				return keep(n, dt, shape)
			}
			return []outTensor{{name: n, dtype: dt, shape: []int64{shape[0], shape[2], shape[1]}, data: pattern(2 * numel(shape))}}
		}
		if len(shape) == 1 && strings.HasSuffix(n, "norm.weight") && !strings.Contains(n, "linear_attn.norm") && !o.hfConv {
			// MLX layout: sanitize added 1 to the zero-centred norms.
			v := float32(1)
			if o.unshifted {
				v = 0.001
			}
			return []outTensor{{name: n, dtype: dt, shape: shape, data: filledBF16(numel(shape), v)}}
		}
		if len(shape) != 2 || !strings.HasSuffix(n, ".weight") {
			return []outTensor{{name: n, dtype: dt, shape: shape, data: nil}}
		}
		module := strings.TrimSuffix(n, ".weight")
		bits := o.bits
		if b, ok := o.override[module]; ok {
			bits = b
		}
		if b, ok := o.packBits[module]; ok {
			bits = b
		}
		out, in := shape[0], shape[1]
		packed := []int64{out, in * bits / 32}
		sc := []int64{out, in / o.group}
		outs := []outTensor{
			{name: n, dtype: tensor.U32, shape: packed, data: pattern(4 * numel(packed))},
			{name: module + ".scales", dtype: tensor.BF16, shape: sc, data: filledBF16(numel(sc), 0.01)},
			{name: module + ".biases", dtype: tensor.BF16, shape: sc, data: filledBF16(numel(sc), -0.08)},
		}
		var kept []outTensor
		for _, x := range outs {
			if x.name != o.noCompanion {
				kept = append(kept, x)
			}
		}
		return kept
	}
	cfg := func(c map[string]any) {
		q := map[string]any{"group_size": o.group, "bits": o.bits, "mode": "affine"}
		for m, b := range o.override {
			q[m] = map[string]any{"group_size": o.group, "bits": b}
		}
		c["quantization"] = q
		c["quantization_config"] = q
	}
	return rewrite(t, src, edit, cfg)
}

func TestMLX(t *testing.T) {
	dense := func(t *testing.T) string { return gen(t, testmodel.Qwen35Options{}) }
	base := mlxOpts{bits: 4, group: 32, override: map[string]int64{"language_model.mtp.fc": 8}}
	with := func(f func(*mlxOpts)) mlxOpts {
		o := base
		f(&o)
		return o
	}
	cases := []ckCase{
		{name: "mlx quantized head ok, norm-shift warning", format: FormatMLX, verdict: OK, conv: ConvQwen,
			build:   func(t *testing.T) string { return buildMLX(t, dense(t), base) },
			warning: "double norm shift"},
		{name: "mlx quantized head, HF conv1d layout: no warning", format: FormatMLX, verdict: OK, conv: ConvQwen,
			build: func(t *testing.T) string { return buildMLX(t, dense(t), with(func(o *mlxOpts) { o.hfConv = true })) }},
		{name: "mlx sanitize dropped the head", format: FormatMLX, verdict: Dropped, conv: ConvQwen,
			build: func(t *testing.T) string {
				return buildMLX(t, dense(t), with(func(o *mlxOpts) {
					o.drop = func(n string) bool { return strings.Contains(n, "mtp.") }
				}))
			},
			message: "sanitize() discards every \"mtp.\" key"},
		{name: "mlx head lost a scales companion", format: FormatMLX, verdict: Partial, conv: ConvQwen,
			build: func(t *testing.T) string {
				return buildMLX(t, dense(t), with(func(o *mlxOpts) { o.noCompanion = "language_model.mtp.layers.0.self_attn.v_proj.scales" }))
			},
			missing: []string{"language_model.mtp.layers.0.self_attn.v_proj.scales"}, warning: "double norm shift"},
		{name: "mlx head packed with other bits than the config says", format: FormatMLX, verdict: Inconsistent, conv: ConvQwen,
			build: func(t *testing.T) string {
				return buildMLX(t, dense(t), with(func(o *mlxOpts) {
					o.packBits = map[string]int64{"language_model.mtp.layers.0.mlp.down_proj": 8}
				}))
			},
			problem: "packed width 32 does not hold 128 4-bit values", warning: "double norm shift"},
		{name: "mlx deep: scales and biases finite, packed weights nonzero", format: FormatMLX, verdict: OK, conv: ConvQwen, deep: true,
			build: func(t *testing.T) string { return buildMLX(t, dense(t), base) }, warning: "double norm shift"},
		{name: "mlx deep: norms measured unshifted, no warning", format: FormatMLX, verdict: OK, conv: ConvQwen, deep: true,
			build: func(t *testing.T) string { return buildMLX(t, dense(t), with(func(o *mlxOpts) { o.unshifted = true })) }},
		{name: "mlx moe head ok", format: FormatMLX, verdict: OK, conv: ConvQwen,
			build:   func(t *testing.T) string { return buildMLX(t, gen(t, testmodel.Qwen35MoEOptions{}), base) },
			warning: "double norm shift"},
	}
	runCkCases(t, cases)
}

// TestMLXDetails checks the logical (unpacked) shapes and the notes.
func TestMLXDetails(t *testing.T) {
	dir := buildMLX(t, gen(t, testmodel.Qwen35Options{}), mlxOpts{bits: 4, group: 32, override: map[string]int64{"language_model.mtp.fc": 8}})
	r, err := MTP(dir, Options{Deep: true})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Tensor{}
	for _, tt := range r.Tensors {
		byName[tt.Name] = tt
	}
	fc := byName["language_model.mtp.fc.weight"]
	if fc.DType != "U32" || len(fc.Shape) != 2 || fc.Shape[1] != 128*8/32 || fc.Want[1] != 128 {
		t.Errorf("mtp.fc: %+v", fc)
	}
	for _, n := range []string{"language_model.mtp.fc.scales", "language_model.mtp.fc.biases"} {
		if tt, ok := byName[n]; !ok || !tt.Present || !strings.Contains(tt.Deep, "finite") {
			t.Errorf("%s: %+v", n, tt)
		}
	}
	if !strings.Contains(fc.Deep, "not all zero bytes") {
		t.Errorf("packed weight deep: %q", fc.Deep)
	}
	if len(r.Notes) == 0 || !strings.Contains(r.Notes[0], "discards mtp.*") {
		t.Errorf("notes %v", r.Notes)
	}
}

// TestMLXSideFile: the head kept in mtp.safetensors beside model*.safetensors
// is found, with a note, and no norm-shift warning because mlx-lm does not
// see it: listed in model.safetensors.index.json (ferry mlx quantize's
// layout) or not (mlx-lm PR #1543's, which had an index of its own).
func TestMLXSideFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		indexed bool
		note    string
	}{
		{"unindexed", false, "mtp.safetensors is an MTP side file: "},
		{"indexed", true, "mtp.safetensors is an MTP side file, listed in model.safetensors.index.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := gen(t, testmodel.Qwen35Options{})
			dir := buildMLX(t, src, mlxOpts{bits: 4, group: 32, drop: func(n string) bool { return strings.Contains(n, "mtp.") }})
			ck, err := safetensors.OpenDir(src)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			var specs []safetensors.TensorSpec
			var locs []safetensors.Location
			for _, l := range ck.Tensors() {
				if strings.HasPrefix(l.Info.Name, "mtp.") {
					specs = append(specs, safetensors.TensorSpec{Name: mlxName(l.Info.Name), DType: l.Info.DType, Shape: l.Info.Shape})
					locs = append(locs, l)
				}
			}
			w, err := safetensors.Create(filepath.Join(dir, "mtp.safetensors"), nil, specs)
			if err != nil {
				t.Fatal(err)
			}
			for i, l := range locs {
				if err := w.WriteTensor(specs[i].Name, l.Section()); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.indexed {
				idx, err := safetensors.ReadIndex(filepath.Join(dir, safetensors.IndexName))
				if err != nil {
					t.Fatal(err)
				}
				for _, sp := range specs {
					idx.WeightMap[sp.Name] = "mtp.safetensors"
				}
				b, _ := json.Marshal(map[string]any{"metadata": map[string]any{}, "weight_map": idx.WeightMap})
				if err := os.WriteFile(filepath.Join(dir, safetensors.IndexName), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			r, err := MTP(dir, Options{Deep: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.Verdict != OK || len(r.Warnings) != 0 || r.Present != 15 {
				t.Fatalf("%s", describe(r))
			}
			found := false
			for _, n := range r.Notes {
				found = found || strings.Contains(n, tc.note)
			}
			if !found {
				t.Errorf("notes %v", r.Notes)
			}
			j, _ := json.Marshal(r)
			if !strings.Contains(string(j), `"format":"mlx"`) {
				t.Errorf("json %s", j)
			}
		})
	}
}
