package mlxpack

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/tensor"
)

// benchCheckpoint is a one-shard qwen3-named checkpoint big enough to time:
// four packed 4-bit g32 modules of [2048, 4096] (4 MiB packed + 512 KiB
// scales each) and a 32 MiB BF16 tensor.
func benchCheckpoint(b *testing.B) (string, int64) {
	return benchCheckpointOf(b, false)
}

// benchCheckpointOf is benchCheckpoint, or with moe the same bytes as a
// qwen3_moe layer: the four modules are experts 0–3 of one up_proj, which
// --rewrite writes as one stacked [4, ...] weight, scales and biases.
func benchCheckpointOf(b *testing.B, moe bool) (string, int64) {
	b.Helper()
	const out, in = 2048, 4096
	c := &testmodel.CompressedCheckpoint{Shards: 1, Files: map[string][]byte{}}
	c.Config = testmodel.CompressedQwen3(1).Config
	module := "model.layers.%d.mlp.up_proj."
	if moe {
		c.Config = testmodel.CompressedQwen3MoE(1).Config
		module = "model.layers.0.mlp.experts.%d.up_proj."
	}
	u := make([]uint32, out*in)
	for i := range u {
		u[i] = uint32(i*7+i/13) & 15
	}
	packed := testmodel.CompressedPack(u, out, in, 4)
	scales := make([]byte, out*in/32*2)
	for i := 0; i < len(scales); i += 2 {
		binary.LittleEndian.PutUint16(scales[i:], 0x3c00+uint16(i%64))
	}
	shp := make([]byte, 16)
	binary.LittleEndian.PutUint64(shp, out)
	binary.LittleEndian.PutUint64(shp[8:], in)
	for l := 0; l < 4; l++ {
		m := fmt.Sprintf(module, l)
		c.Tensors = append(c.Tensors,
			&testmodel.CompressedTensor{Name: m + "weight_packed", DType: tensor.I32, Shape: []int64{out, in / 8}, Data: packed},
			&testmodel.CompressedTensor{Name: m + "weight_scale", DType: tensor.BF16, Shape: []int64{out, in / 32}, Data: scales},
			&testmodel.CompressedTensor{Name: m + "weight_shape", DType: tensor.I64, Shape: []int64{2}, Data: shp},
		)
	}
	c.Tensors = append(c.Tensors, &testmodel.CompressedTensor{Name: "model.embed_tokens.weight", DType: tensor.BF16, Shape: []int64{4096, 4096}, Data: make([]byte, 4096*4096*2)})
	dir := filepath.Join(b.TempDir(), "src")
	if err := c.Write(dir); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		b.Fatal(err)
	}
	return dir, fi.Size()
}

// BenchmarkRewrite times --rewrite of one shard (plan + stream + fsync +
// rename) in source bytes per second; B/op shows memory does not grow
// with the shard (about the 1 MiB chunk buffers, for a 50 MiB shard).
func BenchmarkRewrite(b *testing.B) {
	src, size := benchCheckpoint(b)
	benchRepack(b, src, size, Options{Rewrite: true})
}

// benchRepack times plan + repack of src into a new directory; size, if
// not 0, is the bytes per operation.
func benchRepack(b *testing.B, src string, size int64, opts Options) {
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plan, err := PlanRepack(src, opts)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Repack(context.Background(), plan, filepath.Join(b.TempDir(), "mlx")); err != nil {
			b.Fatal(err)
		}
		plan.Close()
	}
}

// BenchmarkRewriteStacked is BenchmarkRewrite with the four modules
// experts of one qwen3_moe switch_mlp stack: the stacks stream expert after
// expert, so B/op stays at the chunk buffers, not a 16 MiB stack.
func BenchmarkRewriteStacked(b *testing.B) {
	src, size := benchCheckpointOf(b, true)
	benchRepack(b, src, size, Options{Rewrite: true})
}

// BenchmarkRewriteAnchor is the anchor for BenchmarkRewrite: a plain copy
// of the same shard into a new fsynced file.
func BenchmarkRewriteAnchor(b *testing.B) {
	src, size := benchCheckpoint(b)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		in, err := os.Open(filepath.Join(src, "model.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(filepath.Join(b.TempDir(), "copy.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.CopyBuffer(out, in, make([]byte, chunk)); err != nil {
			b.Fatal(err)
		}
		if err := out.Sync(); err != nil {
			b.Fatal(err)
		}
		out.Close()
		in.Close()
	}
}

// BenchmarkRepackLink times a plain link-farm repack of the DeepSeek-V3
// fixture (headers only: cost is per file and per tensor, not per byte).
func BenchmarkRepackLink(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "src")
	if err := testmodel.CompressedDeepSeekV3(1).Write(dir); err != nil {
		b.Fatal(err)
	}
	benchRepack(b, dir, 0, Options{})
}
