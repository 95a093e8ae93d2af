package testmodel

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestLarge27BLayout: Large27B(4) is the anchors.md slice: 4,489,576,096
// parameters (3 linear + 1 full attention layers + 1 MTP layer at
// Qwen3.5-27B widths, vocab 248320). Layout only; nothing is written.
func TestLarge27BLayout(t *testing.T) {
	m, err := Large27B(4).Layout()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.TotalParameters(); got != 4_489_576_096 {
		t.Errorf("parameters %d, want 4,489,576,096", got)
	}
	if got := len(m.MTPNames()); got != 15 {
		t.Errorf("%d MTP tensors", got)
	}
	for _, s := range m.Shards {
		var n int64
		for _, tt := range m.Tensors {
			if tt.Shard == s {
				n += tt.Size()
			}
		}
		if n > 2_000_000_000 && s != m.Shards[len(m.Shards)-1] {
			// Only a single oversized tensor may exceed the limit.
			cnt := 0
			for _, tt := range m.Tensors {
				if tt.Shard == s {
					cnt++
				}
			}
			if cnt > 1 {
				t.Errorf("%s holds %d bytes in %d tensors", s, n, cnt)
			}
		}
	}
}

// BenchmarkLarge27B writes Large27B(4) with a 32768-token vocabulary (about
// 4.6 GB of BF16 in 2 GB shards), then copies the same shard files with
// io.Copy + fsync as the anchor measured in the same run. Compare the two
// MB/s figures. Run with -benchtime=1x.
func BenchmarkLarge27B(b *testing.B) {
	opt := Large27B(4)
	opt.VocabSize = 32768
	dir := filepath.Join(b.TempDir(), "large")
	var m *Model
	b.Run("write", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			os.RemoveAll(dir)
			var err error
			if m, err = opt.Write(dir); err != nil {
				b.Fatal(err)
			}
		}
		b.SetBytes(m.TotalSize())
	})
	if m == nil {
		return
	}
	b.Run("copy-anchor", func(b *testing.B) {
		dst := b.TempDir()
		var total int64
		for i := 0; i < b.N; i++ {
			total = 0
			for _, s := range m.Shards {
				n, err := copyFile(filepath.Join(dir, s), filepath.Join(dst, s))
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
		}
		b.SetBytes(total)
	})
}

func copyFile(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// qwen35Linear are the 12 linear projection kinds of Qwen3.5 (attention,
// linear attention, MLP), the targets of the reference and anchor adapters.
var qwen35Linear = []string{"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b",
	"in_proj_a", "out_proj", "gate_proj", "up_proj", "down_proj"}

// BenchmarkLarge27BAdapter makes the anchors.md DoRA adapter (r=16,
// alpha=32, all 31 linear projections of Large27B(4)) from the layout
// alone (no base files are needed: norms come from the generator) and
// reports the adapter's size, 30,177,032 bytes in anchors.md.
func BenchmarkLarge27BAdapter(b *testing.B) {
	m, err := Large27B(4).Layout()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var size int64
	for i := 0; i < b.N; i++ {
		a, err := AdapterOptions{R: 16, Alpha: 32, DoRA: true, TargetModules: qwen35Linear, BaseModelNameOrPath: "base"}.Write(dir, m)
		if err != nil {
			b.Fatal(err)
		}
		if len(a.Modules) != 31 {
			b.Fatalf("%d modules", len(a.Modules))
		}
		st, err := os.Stat(filepath.Join(dir, "adapter_model.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		size = st.Size()
	}
	b.ReportMetric(float64(size), "adapter-bytes")
}
