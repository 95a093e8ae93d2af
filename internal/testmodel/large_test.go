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
