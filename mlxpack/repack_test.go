package mlxpack

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	desc "github.com/ferry-llm/ferry/internal/family"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
)

func writeFixture(t *testing.T, c *testmodel.CompressedCheckpoint) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := c.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func repack(t *testing.T, src, dst string, opts Options) (*Result, error) {
	t.Helper()
	plan, err := PlanRepack(src, opts)
	if err != nil {
		return nil, err
	}
	defer plan.Close()
	return Repack(context.Background(), plan, dst)
}

func readJSON(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// checkConfig: the destination config is the source config plus the
// quantization block, with quantization_config mirroring it.
func checkConfig(t *testing.T, src, dst string, want map[string]any) {
	t.Helper()
	s := readJSON(t, filepath.Join(src, "config.json"))
	d := readJSON(t, filepath.Join(dst, "config.json"))
	q, ok := d["quantization"].(map[string]any)
	if !ok {
		t.Fatalf("no quantization block in %v", d)
	}
	if !reflect.DeepEqual(q, want) {
		t.Errorf("quantization = %v, want %v", q, want)
	}
	if !reflect.DeepEqual(d["quantization_config"], d["quantization"]) {
		t.Errorf("quantization_config = %v, want it to mirror quantization", d["quantization_config"])
	}
	delete(s, "quantization_config")
	delete(d, "quantization_config")
	delete(d, "quantization")
	if !reflect.DeepEqual(s, d) {
		t.Errorf("config differs beyond the quantization blocks:\nsrc %v\ndst %v", s, d)
	}
}

// checkLinks: every source entry but config.json (and rewritten files) is
// a link in dst resolving to the source file.
func checkLinks(t *testing.T, src, dst string, relative bool, notLinks map[string]bool) {
	t.Helper()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		name := e.Name()
		if name == "config.json" || notLinks[name] {
			continue
		}
		p := filepath.Join(dst, name)
		target, err := os.Readlink(p)
		if err != nil {
			t.Errorf("%s: not a link: %v", name, err)
			continue
		}
		if filepath.IsAbs(target) == relative {
			t.Errorf("%s: target %q, relative=%v", name, target, relative)
		}
		a, err1 := os.Stat(p)
		b, err2 := os.Stat(filepath.Join(src, name))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Errorf("%s: link does not resolve to the source file (%v, %v)", name, err1, err2)
		}
	}
	dents, _ := os.ReadDir(dst)
	if len(dents) != len(ents) {
		t.Errorf("dst has %d entries, src %d", len(dents), len(ents))
	}
}

type stamp struct {
	ino    uint64
	mtime  time.Time
	target string
}

// snapshot records every entry of dir (lstat inode, mtime, link target,
// and file bytes' length via mtime) to prove a re-run touches nothing.
func snapshot(t *testing.T, dir string) map[string]stamp {
	t.Helper()
	out := map[string]stamp{}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		s := stamp{ino: fi.Sys().(*syscall.Stat_t).Ino, mtime: fi.ModTime()}
		if fi.Mode()&os.ModeSymlink != 0 {
			s.target, _ = os.Readlink(p)
		} else if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			s.target = string(data)
		}
		out[e.Name()] = s
	}
	return out
}

var q4g32 = map[string]any{"group_size": 32.0, "bits": 4.0, "mode": "affine"}

func TestRepackLinkFarm(t *testing.T) {
	for _, relative := range []bool{false, true} {
		t.Run(map[bool]string{false: "absolute", true: "relative"}[relative], func(t *testing.T) {
			src := writeFixture(t, testmodel.CompressedDeepSeekV3(1))
			dst := filepath.Join(t.TempDir(), "mlx")
			res, err := repack(t, src, dst, Options{Relative: relative})
			if err != nil {
				t.Fatal(err)
			}
			if res.Mode != ModeLink || res.PackedModules != 12 || !res.Changed {
				t.Errorf("result %+v", res)
			}
			checkLinks(t, src, dst, relative, nil)
			checkConfig(t, src, dst, q4g32)
			cfg, _ := os.ReadFile(filepath.Join(dst, "config.json"))
			if res.NewBytes != int64(len(cfg)) {
				t.Errorf("new bytes %d, want only the config's %d", res.NewBytes, len(cfg))
			}

			// A re-run is a no-op: nothing replaced, same inodes and mtimes.
			before := snapshot(t, dst)
			time.Sleep(10 * time.Millisecond)
			res, err = repack(t, src, dst, Options{Relative: relative})
			if err != nil {
				t.Fatal(err)
			}
			if res.Changed {
				t.Errorf("re-run changed something: %+v", res.Entries)
			}
			if after := snapshot(t, dst); !reflect.DeepEqual(before, after) {
				t.Errorf("re-run touched the destination:\n%v\n%v", before, after)
			}

			// Stale link and edited config are replaced; other entries stay.
			stale := filepath.Join(dst, "tokenizer.json")
			os.Remove(stale)
			if err := os.Symlink("/nonexistent", stale); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, "config.json"), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
			res, err = repack(t, src, dst, Options{Relative: relative})
			if err != nil {
				t.Fatal(err)
			}
			replaced := map[string]bool{}
			for _, e := range res.Entries {
				if e.Action != ActionUnchanged {
					replaced[e.Name] = true
				}
			}
			if !reflect.DeepEqual(replaced, map[string]bool{"tokenizer.json": true, "config.json": true}) {
				t.Errorf("replaced %v", replaced)
			}
			checkLinks(t, src, dst, relative, nil)
			checkConfig(t, src, dst, q4g32)
		})
	}
}

// The farm must open as a checkpoint whose tensors are the source's.
func TestRepackFarmOpens(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedDeepSeekV3(2))
	dst := filepath.Join(t.TempDir(), "mlx")
	if _, err := repack(t, src, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	c, err := safetensors.OpenDirOptions(dst, safetensors.DirOptions{FollowExternalLinks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := len(c.Tensors()); got == 0 {
		t.Fatal("no tensors")
	}
}

func TestRepackQwenNeedsRewrite(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedQwen3(3))
	dst := filepath.Join(t.TempDir(), "mlx")
	_, err := repack(t, src, dst, Options{})
	if !errors.Is(err, ErrNeedsRewrite) || !isBadInput(err) || !strings.Contains(err.Error(), "--rewrite") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dst created: %v", err)
	}
}

func isBadInput(err error) bool {
	var bi interface{ BadInput() bool }
	return errors.As(err, &bi) && bi.BadInput()
}

// mlxDequantize is MLX's affine dequantization (mlx ops.cpp
// affine_dequantize): w = q·scale + bias with q the unsigned bits-wide
// value at bit i·bits of the row's LSB-first uint32 stream; computed in
// float64 (exact here) and rounded once to the scale dtype.
func mlxDequantize(t *testing.T, w, scales, biases []byte, dt tensor.DType, out, in int64, bits, group int) []float32 {
	t.Helper()
	words := in * int64(bits) / 32
	groups := in / int64(group)
	sc := make([]float32, out*groups)
	bi := make([]float32, out*groups)
	if err := tensor.ToF32(dt, sc, scales); err != nil {
		t.Fatal(err)
	}
	if err := tensor.ToF32(dt, bi, biases); err != nil {
		t.Fatal(err)
	}
	res := make([]float32, out*in)
	one := make([]byte, dt.Bits()/8)
	v := make([]float32, 1)
	for o := int64(0); o < out; o++ {
		for i := int64(0); i < in; i++ {
			var q uint64
			for b := 0; b < bits; b++ {
				pos := i*int64(bits) + int64(b)
				word := binary.LittleEndian.Uint32(w[(o*words+pos/32)*4:])
				q |= uint64(word>>(pos%32)&1) << b
			}
			g := o*groups + i/int64(group)
			x := float64(q)*float64(sc[g]) + float64(bi[g])
			if err := tensor.FromF32(dt, one, []float32{float32(x)}); err != nil {
				t.Fatal(err)
			}
			tensor.ToF32(dt, v, one)
			res[o*in+i] = v[0]
		}
	}
	return res
}

func readTensor(t *testing.T, c *safetensors.Checkpoint, name string) (safetensors.TensorInfo, []byte) {
	t.Helper()
	l, ok := c.Lookup(name)
	if !ok {
		t.Fatalf("no tensor %q", name)
	}
	b, err := io.ReadAll(l.Section())
	if err != nil {
		t.Fatal(err)
	}
	return l.Info, b
}

func TestRewriteDequantizesExactly(t *testing.T) {
	q8 := testmodel.CompressedScheme{Bits: 8, GroupSize: 64}
	cases := []struct {
		name    string
		fixture *testmodel.CompressedCheckpoint
		want    map[string]any
	}{
		{"qwen3-int4-g32", testmodel.CompressedQwen3(4), q4g32},
		{"qwen3-int8-g32", testmodel.CompressedQwen3With(5, testmodel.CompressedScheme{Bits: 8, GroupSize: 32}, nil), map[string]any{"group_size": 32.0, "bits": 8.0, "mode": "affine"}},
		{"qwen3-int2-g64", testmodel.CompressedQwen3With(6, testmodel.CompressedScheme{Bits: 2, GroupSize: 64}, nil), map[string]any{"group_size": 64.0, "bits": 2.0, "mode": "affine"}},
		{"qwen3-mixed", testmodel.CompressedQwen3With(8, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &q8), map[string]any{
			"group_size": 32.0, "bits": 4.0, "mode": "affine",
			"model.layers.0.mlp.down_proj": map[string]any{"group_size": 64.0, "bits": 8.0},
			"model.layers.1.mlp.down_proj": map[string]any{"group_size": 64.0, "bits": 8.0},
		}},
		{"deepseek-v3", testmodel.CompressedDeepSeekV3(9), q4g32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, dst, res := rewriteFixture(t, tc.fixture, tc.want)
			// Rewritten shards are files; the rest are links.
			checkLinks(t, src, dst, false, rewrittenFiles(res))
			sc, dc := openBoth(t, src, dst)
			if packed, _ := checkRewritten(t, sc, dc, false); packed != res.PackedModules || packed == 0 {
				t.Errorf("checked %d packed modules, plan had %d", packed, res.PackedModules)
			}
			checkRerunNoop(t, src, dst)
		})
	}
}

// rewriteFixture writes the fixture and repacks it with --rewrite; the
// config must carry the quantization block want.
func rewriteFixture(t *testing.T, c *testmodel.CompressedCheckpoint, want map[string]any) (src, dst string, res *Result) {
	t.Helper()
	src = writeFixture(t, c)
	dst = filepath.Join(t.TempDir(), "mlx")
	res, err := repack(t, src, dst, Options{Rewrite: true})
	if err != nil {
		t.Fatal(err)
	}
	checkConfig(t, src, dst, want)
	return src, dst, res
}

// rewrittenFiles are the entries a --rewrite wrote as files: its shards
// and the index.
func rewrittenFiles(res *Result) map[string]bool {
	files := map[string]bool{safetensors.IndexName: true}
	for _, e := range res.Entries {
		if e.Kind == EntryShard {
			files[e.Name] = true
		}
	}
	return files
}

// openBoth opens the source checkpoint and the repacked one (through its
// links), closed when the test ends.
func openBoth(t *testing.T, src, dst string) (sc, dc *safetensors.Checkpoint) {
	t.Helper()
	sc, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	dc, err = safetensors.OpenDirOptions(dst, safetensors.DirOptions{FollowExternalLinks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	return sc, dc
}

// checkRewritten checks a --rewrite module by module: every packed
// module's weight, scales and biases dequantize to exactly what
// compressed-tensors' do (with stacked, an expert is read from its part of
// the switch_mlp stack [E, ...]); every other tensor is carried byte for
// byte; no weight_scale or weight_shape survives. It returns the packed
// modules checked and the experts among them.
func checkRewritten(t *testing.T, sc, dc *safetensors.Checkpoint, stacked bool) (packed, experts int) {
	t.Helper()
	for _, l := range sc.Tensors() {
		name := l.Info.Name
		mod, ok := strings.CutSuffix(name, ".weight_packed")
		if !ok {
			if strings.HasSuffix(name, ".weight_scale") || strings.HasSuffix(name, ".weight_shape") {
				if _, ok := dc.Lookup(name); ok {
					t.Errorf("%s survived the rewrite", name)
				}
				continue
			}
			si, sb := readTensor(t, sc, name)
			di, db := readTensor(t, dc, name)
			if si.DType != di.DType || !slices.Equal(si.Shape, di.Shape) || string(sb) != string(db) {
				t.Errorf("%s changed", name)
			}
			continue
		}
		packed++
		_, pb := readTensor(t, sc, name)
		ssi, sb := readTensor(t, sc, mod+".weight_scale")
		_, shb := readTensor(t, sc, mod+".weight_shape")
		out, in := int64(binary.LittleEndian.Uint64(shb)), int64(binary.LittleEndian.Uint64(shb[8:]))
		dmod, e := mod, -1
		if m := testExpertRE.FindStringSubmatch(mod); m != nil && stacked {
			dmod = m[1] + ".switch_mlp." + m[3]
			e, _ = strconv.Atoi(m[2])
			experts++
		}
		wi, wb := readTensor(t, dc, dmod+".weight")
		sci, scb := readTensor(t, dc, dmod+".scales")
		bi, bb := readTensor(t, dc, dmod+".biases")
		if wi.DType != tensor.U32 || bi.DType != ssi.DType || sci.DType != ssi.DType {
			t.Errorf("%s: weight %s, scales %s, biases %s", dmod, wi.DType, sci.DType, bi.DType)
		}
		if e >= 0 {
			// Stacked [4, out, ·]: take expert e's slice.
			if len(wi.Shape) != 3 || wi.Shape[0] != 4 || !slices.Equal(sci.Shape, bi.Shape) || len(sci.Shape) != 3 || sci.Shape[0] != 4 {
				t.Fatalf("%s: weight %v, scales %v, biases %v", dmod, wi.Shape, sci.Shape, bi.Shape)
			}
			wb = slice(wb, 4, e)
			scb = slice(scb, 4, e)
			bb = slice(bb, 4, e)
		}
		bits := int(wi.Shape[len(wi.Shape)-1] * 32 / in)
		group := int(in / ssi.Shape[len(ssi.Shape)-1])
		want, err := testmodel.CompressedDequantize(pb, sb, ssi.DType, out, in, bits, group)
		if err != nil {
			t.Fatal(err)
		}
		got := mlxDequantize(t, wb, scb, bb, ssi.DType, out, in, bits, group)
		for i := range want {
			if want[i] != got[i] {
				t.Fatalf("%s (expert %d) element %d: MLX %g, compressed-tensors %g", dmod, e, i, got[i], want[i])
			}
		}
	}
	return packed, experts
}

// checkRerunNoop: the same --rewrite again changes nothing and touches
// nothing.
func checkRerunNoop(t *testing.T, src, dst string) {
	t.Helper()
	before := snapshot(t, dst)
	res, err := repack(t, src, dst, Options{Rewrite: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed {
		t.Errorf("re-run changed %+v", res.Entries)
	}
	if after := snapshot(t, dst); !reflect.DeepEqual(before, after) {
		t.Error("re-run touched the destination")
	}
}

// The check of the test itself: a wrong bias (zero point) or a wrong
// nibble order must show up as a mismatch.
func TestDequantizeCheckCatchesErrors(t *testing.T) {
	c := testmodel.CompressedQwen3(10)
	p := c.Find("model.layers.0.mlp.up_proj.weight_packed")
	s := c.Find("model.layers.0.mlp.up_proj.weight_scale")
	out, in := int64(128), int64(64)
	want, err := testmodel.CompressedDequantize(p.Data, s.Data, s.DType, out, in, 4, 32)
	if err != nil {
		t.Fatal(err)
	}
	sc := make([]float32, len(s.Data)/2)
	tensor.BF16ToF32(sc, s.Data)
	bias := func(k float32) []byte {
		b := make([]float32, len(sc))
		for i := range b {
			b[i] = -k * sc[i]
		}
		out := make([]byte, 2*len(b))
		tensor.F32ToBF16(out, b)
		return out
	}
	swapped := append([]byte(nil), p.Data...)
	for i := range swapped {
		swapped[i] = swapped[i]<<4 | swapped[i]>>4
	}
	for name, tc := range map[string]struct{ w, b []byte }{
		"bias -7·scale":      {p.Data, bias(7)},
		"nibbles high first": {swapped, bias(8)},
	} {
		got := mlxDequantize(t, tc.w, s.Data, tc.b, s.DType, out, in, 4, 32)
		if reflect.DeepEqual(got, want) {
			t.Errorf("%s: not caught", name)
		}
	}
	if got := mlxDequantize(t, p.Data, s.Data, bias(8), s.DType, out, in, 4, 32); !reflect.DeepEqual(got, want) {
		t.Error("the right layout does not match")
	}
}

// dirState is a byte-level picture of a directory tree for "untouched"
// checks: names, modes, link targets, file bytes.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			tg, _ := os.Readlink(p)
			out[rel] = "link:" + tg
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			out[rel] = "file:" + string(b) + fi.ModTime().String()
		default:
			out[rel] = fi.Mode().String()
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

func TestBadInputs(t *testing.T) {
	type mutate func(t *testing.T, c *testmodel.CompressedCheckpoint, dir string)
	qc := func(c *testmodel.CompressedCheckpoint) map[string]any {
		return c.Config["quantization_config"].(map[string]any)
	}
	cases := []struct {
		name     string
		rewrite  bool
		before   func(c *testmodel.CompressedCheckpoint) // on the fixture
		after    mutate                                  // on the written files
		sentinel error
		mention  string
	}{
		{name: "no quantization_config", before: func(c *testmodel.CompressedCheckpoint) { delete(c.Config, "quantization_config") }, sentinel: ErrNoQuantConfig},
		{name: "awq method", before: func(c *testmodel.CompressedCheckpoint) { qc(c)["quant_method"] = "awq" }, sentinel: ErrNotCompressed, mention: "awq"},
		{name: "float-quantized format", before: func(c *testmodel.CompressedCheckpoint) { qc(c)["format"] = "float-quantized" }, sentinel: ErrFormat},
		{name: "asymmetric declared", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["symmetric"] = false }, sentinel: ErrAsymmetric},
		{name: "zero point stored", before: func(c *testmodel.CompressedCheckpoint) {
			c.Tensors = append(c.Tensors, &testmodel.CompressedTensor{Name: "model.layers.1.mlp.experts.0.up_proj.weight_zero_point", DType: tensor.I32, Shape: []int64{4, 2}, Data: make([]byte, 32), Shard: 1})
		}, sentinel: ErrAsymmetric, mention: "weight_zero_point"},
		{name: "actorder group", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["actorder"] = "group" }, sentinel: ErrActOrder},
		{name: "g_idx stored", before: func(c *testmodel.CompressedCheckpoint) {
			c.Tensors = append(c.Tensors, &testmodel.CompressedTensor{Name: "model.layers.1.mlp.experts.1.down_proj.weight_g_idx", DType: tensor.I32, Shape: []int64{32}, Data: make([]byte, 128), Shard: 1})
		}, sentinel: ErrActOrder, mention: "weight_g_idx"},
		{name: "channel strategy", before: func(c *testmodel.CompressedCheckpoint) {
			w := c.QuantWeights("group_0")
			w["strategy"], w["group_size"] = "channel", nil
		}, sentinel: ErrStrategy},
		{name: "group size 16", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["group_size"] = 16 }, sentinel: ErrGroupSize},
		{name: "7 bits", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["num_bits"] = 7 }, sentinel: ErrBits},
		// compressed-tensors packs 10 3-bit values per int32 with 2 padding
		// bits: not MLX's bit stream, so no farm or rewrite can carry it.
		{name: "3 bits (padded int32 packing)", rewrite: true, before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["num_bits"] = 3 }, sentinel: ErrBits, mention: "10 values per int32"},
		{name: "input activations", before: func(c *testmodel.CompressedCheckpoint) {
			qc(c)["config_groups"].(map[string]any)["group_0"].(map[string]any)["input_activations"] = map[string]any{"num_bits": 8}
		}, sentinel: ErrActivations},
		{name: "declared 8 bits, packed 4", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["num_bits"] = 8 }, sentinel: ErrInconsistent, mention: "weight_packed"},
		{name: "declared group 64, scales for 32", before: func(c *testmodel.CompressedCheckpoint) { c.QuantWeights("group_0")["group_size"] = 64 }, sentinel: ErrInconsistent, mention: "weight_scale"},
		{name: "packed wrong shape", before: func(c *testmodel.CompressedCheckpoint) {
			p := c.Find("model.layers.1.mlp.experts.2.gate_proj.weight_packed")
			p.Shape = []int64{16, 16}
		}, sentinel: ErrInconsistent, mention: "[16 16]"},
		{name: "packed wrong dtype", before: func(c *testmodel.CompressedCheckpoint) {
			c.Find("model.layers.1.mlp.experts.3.up_proj.weight_packed").DType = tensor.U32
		}, sentinel: ErrInconsistent, mention: "I32"},
		{name: "weight_shape disagrees", before: func(c *testmodel.CompressedCheckpoint) {
			s := c.Find("model.layers.1.mlp.experts.0.gate_proj.weight_shape")
			binary.LittleEndian.PutUint64(s.Data[8:], 96)
		}, sentinel: ErrInconsistent, mention: "weight_shape"},
		{name: "weight_shape negative", before: func(c *testmodel.CompressedCheckpoint) {
			s := c.Find("model.layers.1.mlp.experts.0.gate_proj.weight_shape")
			binary.LittleEndian.PutUint64(s.Data[0:], uint64(1)<<63)
		}, sentinel: ErrInconsistent},
		{name: "scale missing", before: func(c *testmodel.CompressedCheckpoint) {
			c.Remove("model.layers.1.mlp.experts.1.gate_proj.weight_scale")
		}, sentinel: ErrInconsistent, mention: "weight_scale"},
		{name: "packed module on the ignore list", before: func(c *testmodel.CompressedCheckpoint) {
			qc(c)["ignore"] = append(qc(c)["ignore"].([]any), `re:.*experts\.3\..*`)
		}, sentinel: ErrInconsistent, mention: "ignore"},
		{name: "index points outside", after: func(t *testing.T, c *testmodel.CompressedCheckpoint, dir string) {
			p := filepath.Join(dir, safetensors.IndexName)
			b, _ := os.ReadFile(p)
			b = []byte(strings.Replace(string(b), `"model-00003-of-00003.safetensors"`, `"../elsewhere/model-00003-of-00003.safetensors"`, 1))
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, sentinel: safetensors.ErrOutsideDir},
		{name: "shard symlink leaves the directory", after: func(t *testing.T, c *testmodel.CompressedCheckpoint, dir string) {
			p := filepath.Join(dir, "model-00002-of-00003.safetensors")
			other := filepath.Join(t.TempDir(), "elsewhere.safetensors")
			if err := os.Rename(p, other); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(other, p); err != nil {
				t.Fatal(err)
			}
		}, sentinel: safetensors.ErrOutsideDir},
		{name: "no config.json", after: func(t *testing.T, c *testmodel.CompressedCheckpoint, dir string) {
			os.Remove(filepath.Join(dir, "config.json"))
		}, sentinel: ErrNoConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testmodel.CompressedDeepSeekV3(11)
			if tc.before != nil {
				tc.before(c)
			}
			src := writeFixture(t, c)
			if tc.after != nil {
				tc.after(t, c, src)
			}
			srcBefore := dirState(t, src)

			// DST absent stays absent.
			absent := filepath.Join(t.TempDir(), "mlx")
			_, err := repack(t, src, absent, Options{Rewrite: tc.rewrite})
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, tc.sentinel) || !isBadInput(err) {
				t.Fatalf("err = %v (%T), want %v, bad input", err, err, tc.sentinel)
			}
			t.Log(err)
			if tc.mention != "" && !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			if _, err := os.Lstat(absent); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("absent dst now exists")
			}
			if ents, _ := os.ReadDir(filepath.Dir(absent)); len(ents) != 0 {
				t.Errorf("left %v beside dst", ents)
			}

			// DST existing (a farm of a good checkpoint) stays byte-identical.
			good := writeFixture(t, testmodel.CompressedDeepSeekV3(11))
			existing := filepath.Join(t.TempDir(), "mlx")
			if _, err := repack(t, good, existing, Options{}); err != nil {
				t.Fatal(err)
			}
			want := dirState(t, existing)
			if _, err := repack(t, src, existing, Options{Rewrite: tc.rewrite}); !errors.Is(err, tc.sentinel) {
				t.Fatalf("existing dst: err = %v", err)
			}
			if got := dirState(t, existing); !reflect.DeepEqual(got, want) {
				t.Error("existing dst changed")
			}
			if got := dirState(t, src); !reflect.DeepEqual(got, srcBefore) {
				t.Error("source changed")
			}
		})
	}
}

func TestPlainRepackRefusesNon4Bit(t *testing.T) {
	c := testmodel.CompressedQwen3With(12, testmodel.CompressedScheme{Bits: 8, GroupSize: 32}, nil)
	c.Config["model_type"] = "deepseek_v3"
	src := writeFixture(t, c)
	_, err := repack(t, src, filepath.Join(t.TempDir(), "mlx"), Options{})
	if !errors.Is(err, ErrNeedsRewrite) || !strings.Contains(err.Error(), "−8·scales") {
		t.Fatalf("err = %v", err)
	}
}

func TestMixedSettings(t *testing.T) {
	q8 := testmodel.CompressedScheme{Bits: 8, GroupSize: 64}
	t.Run("unknown model type", func(t *testing.T) {
		c := testmodel.CompressedQwen3With(13, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &q8)
		c.Config["model_type"] = "qwen3_5_text"
		src := writeFixture(t, c)
		_, err := repack(t, src, filepath.Join(t.TempDir(), "mlx"), Options{Rewrite: true})
		if !errors.Is(err, ErrMixed) || !isBadInput(err) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("experts stacked with different settings", func(t *testing.T) {
		c := testmodel.CompressedDeepSeekV3(14)
		qc := c.Config["quantization_config"].(map[string]any)
		groups := qc["config_groups"].(map[string]any)
		g1 := map[string]any{}
		b, _ := json.Marshal(groups["group_0"])
		json.Unmarshal(b, &g1)
		g1["targets"] = []any{"model.layers.1.mlp.experts.3.down_proj"}
		g1["weights"].(map[string]any)["group_size"] = 32
		g1["weights"].(map[string]any)["num_bits"] = 8
		groups["group_1"] = g1
		// Repack expert 3's down_proj at 8 bits so the shapes agree.
		for _, n := range []string{"weight_packed", "weight_scale", "weight_shape"} {
			c.Remove("model.layers.1.mlp.experts.3.down_proj." + n)
		}
		u := make([]uint32, 64*32)
		for i := range u {
			u[i] = uint32(i % 256)
		}
		sc := make([]byte, 64*2)
		for i := 0; i < 64; i++ {
			binary.LittleEndian.PutUint16(sc[2*i:], 0x3c00)
		}
		shp := make([]byte, 16)
		binary.LittleEndian.PutUint64(shp, 64)
		binary.LittleEndian.PutUint64(shp[8:], 32)
		m := "model.layers.1.mlp.experts.3.down_proj."
		c.Tensors = append(c.Tensors,
			&testmodel.CompressedTensor{Name: m + "weight_packed", DType: tensor.I32, Shape: []int64{64, 8}, Data: testmodel.CompressedPack(u, 64, 32, 8), Shard: 2},
			&testmodel.CompressedTensor{Name: m + "weight_scale", DType: tensor.BF16, Shape: []int64{64, 1}, Data: sc, Shard: 2},
			&testmodel.CompressedTensor{Name: m + "weight_shape", DType: tensor.I64, Shape: []int64{2}, Data: shp, Shard: 2},
		)
		src := writeFixture(t, c)
		_, err := repack(t, src, filepath.Join(t.TempDir(), "mlx"), Options{Rewrite: true})
		if !errors.Is(err, ErrMixed) || !strings.Contains(err.Error(), "switch_mlp.down_proj") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestDestinationRules(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedDeepSeekV3(16))
	t.Run("foreign file refused, --force leaves it", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, "NOTES.md"), []byte("mine"), 0o644)
		before := dirState(t, dst)
		_, err := repack(t, src, dst, Options{})
		if !errors.Is(err, ErrDestination) || !strings.Contains(err.Error(), "NOTES.md") {
			t.Fatalf("err = %v", err)
		}
		if !reflect.DeepEqual(dirState(t, dst), before) {
			t.Error("dst changed")
		}
		res, err := repack(t, src, dst, Options{Force: true})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(res.Foreign, []string{"NOTES.md"}) {
			t.Errorf("foreign %v", res.Foreign)
		}
		if b, _ := os.ReadFile(filepath.Join(dst, "NOTES.md")); string(b) != "mine" {
			t.Error("foreign file touched")
		}
	})
	t.Run("foreign weights refused even with --force", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, "model-00001-of-00009.safetensors"), []byte("x"), 0o644)
		if _, err := repack(t, src, dst, Options{Force: true}); !errors.Is(err, ErrDestination) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("regular file where a link goes", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, "tokenizer.json"), []byte("{}"), 0o644)
		if _, err := repack(t, src, dst, Options{}); !errors.Is(err, ErrDestination) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("inside the source", func(t *testing.T) {
		dst := filepath.Join(src, "mlx")
		if _, err := repack(t, src, dst, Options{}); !errors.Is(err, ErrDestinationInside) {
			t.Fatalf("err = %v", err)
		}
		if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
			t.Error("created inside the source")
		}
		if _, err := repack(t, src, src, Options{}); !errors.Is(err, ErrDestinationInside) {
			t.Fatalf("dst = src: err = %v", err)
		}
	})
	t.Run("leftover temp files of a killed run are cleaned", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, ".config.json.12345.partial"), []byte("half"), 0o644)
		if _, err := repack(t, src, dst, Options{}); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, src, dst, false, nil)
	})
	t.Run("missing parents are created", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "a", "b", "mlx")
		if _, err := repack(t, src, dst, Options{}); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, src, dst, false, nil)
	})
	t.Run("source is a file", func(t *testing.T) {
		_, err := repack(t, filepath.Join(src, "config.json"), filepath.Join(t.TempDir(), "mlx"), Options{})
		if !errors.Is(err, ErrNoConfig) || !isBadInput(err) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("plain then rewrite then plain", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "mlx")
		for _, rw := range []bool{false, true} {
			if _, err := repack(t, src, dst, Options{Rewrite: rw}); err != nil {
				t.Fatalf("rewrite=%v: %v", rw, err)
			}
		}
		// Back to plain: rewritten shards are regular files where links go.
		if _, err := repack(t, src, dst, Options{}); !errors.Is(err, ErrDestination) {
			t.Fatalf("err = %v", err)
		}
		if _, err := repack(t, src, dst, Options{Force: true}); err != nil {
			t.Fatal(err)
		}
		checkLinks(t, src, dst, false, nil)
	})
}

func TestCancel(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedQwen3(17))
	plan, err := PlanRepack(src, Options{Rewrite: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plan.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dst := filepath.Join(t.TempDir(), "mlx")
	if _, err := Repack(ctx, plan, dst); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(dst)); len(ents) != 0 {
		t.Errorf("left %v", ents)
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedQwen3With(18, testmodel.CompressedScheme{Bits: 4, GroupSize: 32}, &testmodel.CompressedScheme{Bits: 8, GroupSize: 64}))
	var first []byte
	for i := 0; i < 5; i++ {
		p, err := PlanRepack(src, Options{Rewrite: true})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(p)
		b = append(b, p.Config()...)
		b = append(b, p.index...)
		p.Close()
		if first == nil {
			first = b
		} else if string(b) != string(first) {
			t.Fatal("plan differs between runs")
		}
	}
}

func TestStaleLinkOfRemovedSourceFile(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedDeepSeekV3(19))
	dst := filepath.Join(t.TempDir(), "mlx")
	if _, err := repack(t, src, dst, Options{Relative: true}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(src, "tiktoken.model")); err != nil {
		t.Fatal(err)
	}
	res, err := repack(t, src, dst, Options{Relative: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.Removed, []string{"tiktoken.model"}) || !res.Changed {
		t.Errorf("removed %v, changed %v", res.Removed, res.Changed)
	}
	checkLinks(t, src, dst, true, nil)
}

func TestDestinationIsLinkToDirectory(t *testing.T) {
	src := writeFixture(t, testmodel.CompressedDeepSeekV3(20))
	real := t.TempDir()
	dst := filepath.Join(t.TempDir(), "via-link")
	if err := os.Symlink(real, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := repack(t, src, dst, Options{Relative: true}); err != nil {
		t.Fatal(err)
	}
	checkLinks(t, src, real, true, nil)
}

// kimi_k25 nests quantization_config in text_config and prefixes the
// language model's names; mlx-lm lifts the nested block and runs the
// deepseek_v3 sanitize on the language model.
func TestKimiK25(t *testing.T) {
	c := testmodel.CompressedDeepSeekV3(21)
	qc := c.Config["quantization_config"]
	delete(c.Config, "quantization_config")
	c.Config = map[string]any{
		"architectures": []any{"KimiK25ForConditionalGeneration"},
		"model_type":    "kimi_k25",
		"text_config":   c.Config,
	}
	c.Config["text_config"].(map[string]any)["quantization_config"] = qc
	c.Config["text_config"].(map[string]any)["model_type"] = "kimi_k2"
	for _, tn := range c.Tensors {
		tn.Name = "language_model." + tn.Name
	}
	// The ignore regexes are unanchored at the end and start with .*, so
	// they still match the prefixed names.
	src := writeFixture(t, c)
	dst := filepath.Join(t.TempDir(), "mlx")
	res, err := repack(t, src, dst, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mode != ModeLink || res.PackedModules != 12 {
		t.Errorf("%+v", res)
	}
	checkConfig(t, src, dst, q4g32)
	d := readJSON(t, filepath.Join(dst, "config.json"))
	if _, ok := d["text_config"].(map[string]any)["quantization_config"]; !ok {
		t.Error("text_config.quantization_config dropped")
	}
}

func TestMLXPaths(t *testing.T) {
	cases := []struct {
		modelType, module string
		want              []string
		ok                bool
	}{
		{"deepseek_v3", "model.layers.3.mlp.experts.17.down_proj", []string{"model.layers.3.mlp.switch_mlp.down_proj"}, true},
		{"kimi_k25", "language_model.model.layers.3.mlp.experts.0.gate_proj", []string{"language_model.model.layers.3.mlp.switch_mlp.gate_proj"}, true},
		{"kimi_k2", "model.layers.3.self_attn.kv_b_proj", []string{"model.layers.3.self_attn.embed_q", "model.layers.3.self_attn.unembed_out"}, true},
		{"deepseek_v3", "model.layers.3.self_attn.o_proj", []string{"model.layers.3.self_attn.o_proj"}, true},
		{"qwen3", "model.layers.0.mlp.down_proj", []string{"model.layers.0.mlp.down_proj"}, true},
		{"qwen3_5", "model.language_model.layers.0.mlp.down_proj", []string{"model.language_model.layers.0.mlp.down_proj"}, false},
		{"qwen3_moe", "model.layers.2.mlp.experts.11.up_proj", []string{"model.layers.2.mlp.switch_mlp.up_proj"}, true},
		{"qwen3_moe", "model.layers.2.self_attn.q_proj", []string{"model.layers.2.self_attn.q_proj"}, true},
		{"qwen3_5_moe", "model.language_model.layers.0.mlp.experts.3.down_proj", []string{"language_model.model.layers.0.mlp.switch_mlp.down_proj"}, true},
		{"qwen3_5_moe", "model.language_model.mtp.layers.0.mlp.experts.3.down_proj", []string{"language_model.mtp.layers.0.mlp.switch_mlp.down_proj"}, true},
		{"qwen3_5_moe", "mtp.layers.0.mlp.experts.3.gate_proj", []string{"language_model.mtp.layers.0.mlp.switch_mlp.gate_proj"}, true},
		{"qwen3_5_moe", "model.language_model.layers.0.linear_attn.in_proj_qkv", []string{"language_model.model.layers.0.linear_attn.in_proj_qkv"}, true},
		{"joyai_llm_flash", "model.layers.1.self_attn.kv_b_proj", []string{"model.layers.1.self_attn.embed_q", "model.layers.1.self_attn.unembed_out"}, true},
		{"llama", "model.layers.0.self_attn.q_proj", []string{"model.layers.0.self_attn.q_proj"}, true},
		{"qwen2", "model.layers.0.mlp.experts.1.up_proj", []string{"model.layers.0.mlp.experts.1.up_proj"}, true},
		// mlx-lm loads mistral with llama's model, and a text-only Qwen3.5
		// MoE as qwen3_5_moe.
		{"mistral", "model.layers.0.self_attn.q_proj", []string{"model.layers.0.self_attn.q_proj"}, true},
		{"qwen3_5_moe_text", "model.layers.0.mlp.experts.3.down_proj", []string{"language_model.model.layers.0.mlp.switch_mlp.down_proj"}, true},
		{"qwen3_next", "model.layers.0.mlp.experts.3.down_proj", []string{"model.layers.0.mlp.experts.3.down_proj"}, false},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		got, ok := mlxPaths(tc.modelType, tc.module)
		if !reflect.DeepEqual(got, tc.want) || ok != tc.ok {
			t.Errorf("mlxPaths(%q, %q) = %v, %v; want %v, %v", tc.modelType, tc.module, got, ok, tc.want, tc.ok)
		}
		covered[tc.modelType] = true
	}
	// Every family descriptor with a path mapping has it checked here.
	for _, mt := range desc.MLXModelTypes(func(m *desc.MLX) bool { return m.Paths != "" }) {
		if !covered[mt] {
			t.Errorf("model_type %q has a path mapping in its family descriptor but no case here", mt)
		}
	}
}

func TestRewriteSameWhateverJobs(t *testing.T) {
	for name, c := range map[string]*testmodel.CompressedCheckpoint{
		"deepseek_v3": testmodel.CompressedDeepSeekV3(23),
		"qwen3_moe":   testmodel.CompressedQwen3MoE(24),
	} {
		t.Run(name, func(t *testing.T) { rewriteSameWhateverJobs(t, c) })
	}
}

func rewriteSameWhateverJobs(t *testing.T, c *testmodel.CompressedCheckpoint) {
	src := writeFixture(t, c)
	var want map[string]string
	for _, jobs := range []int{1, 2, 8} {
		dst := filepath.Join(t.TempDir(), "mlx")
		if _, err := repack(t, src, dst, Options{Rewrite: true, Jobs: jobs, Relative: true}); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		ents, _ := os.ReadDir(dst)
		for _, e := range ents {
			p := filepath.Join(dst, e.Name())
			if tg, err := os.Readlink(p); err == nil {
				got[e.Name()] = "link:" + tg
			} else {
				b, _ := os.ReadFile(p)
				got[e.Name()] = string(b)
			}
		}
		if want == nil {
			want = got
		} else if !reflect.DeepEqual(got, want) {
			t.Errorf("jobs %d: output differs", jobs)
		}
	}
}
