package gguf

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/gguf/quant"
)

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	f *os.File
	n atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.f.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// bigLayout is a Qwen3.5-27B-like header: 64 layers of 27B-width tensors
// (about 50 GB of data), optionally with a 248320-token vocabulary.
func bigLayout(t testing.TB, vocab int) *Layout {
	kvs := []KV{Str("general.architecture", "qwen35"), U32("qwen35.block_count", 64)}
	if vocab > 0 {
		toks := make([]string, vocab)
		types := make([]int32, vocab)
		for i := range toks {
			toks[i] = fmt.Sprintf("tok%06d", i)
			types[i] = 1
		}
		kvs = append(kvs, Strings("tokenizer.ggml.tokens", toks), I32s("tokenizer.ggml.token_type", types))
	}
	specs := []TensorSpec{{"token_embd.weight", []uint64{5120, 248320}, quant.F16}}
	for l := 0; l < 64; l++ {
		for _, s := range []struct {
			n   string
			d   []uint64
			typ quant.Type
		}{
			{"attn_qkv.weight", []uint64{5120, 10240}, quant.F16},
			{"attn_gate.weight", []uint64{5120, 6144}, quant.F16},
			{"ssm_out.weight", []uint64{6144, 5120}, quant.F16},
			{"ffn_gate.weight", []uint64{5120, 17408}, quant.F16},
			{"ffn_up.weight", []uint64{5120, 17408}, quant.F16},
			{"ffn_down.weight", []uint64{17408, 5120}, quant.F16},
			{"attn_norm.weight", []uint64{5120}, quant.F32},
		} {
			specs = append(specs, TensorSpec{fmt.Sprintf("blk.%d.%s", l, s.n), s.d, s.typ})
		}
	}
	specs = append(specs, TensorSpec{"output.weight", []uint64{5120, 248320}, quant.F16})
	l, err := PlanLayout(kvs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func sparseFile(t testing.TB, l *Layout) string {
	p := filepath.Join(t.TempDir(), "big.gguf")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(l.Header); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(l.Size); err != nil { // sparse: no data blocks
		t.Fatal(err)
	}
	return p
}

// The reader reads the header and nothing of the data section.
func TestParseReadsOnlyTheHeader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		vocab int
		limit int64
	}{{"no vocabulary", 0, 1 << 20}, {"248320-token vocabulary", 248320, 0}} {
		// The parser may read ahead at most readBuf bytes past the header.
		t.Run(tc.name, func(t *testing.T) {
			l := bigLayout(t, tc.vocab)
			if l.Size < 40e9 {
				t.Fatalf("layout only %d bytes", l.Size)
			}
			p := sparseFile(t, l)
			fh, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer fh.Close()
			cr := &countingReaderAt{f: fh}
			f, err := Parse(cr, l.Size, p)
			if err != nil {
				t.Fatal(err)
			}
			read := cr.n.Load()
			limit := tc.limit
			if limit == 0 {
				limit = l.DataOffset + readBuf
			}
			t.Logf("%d-byte file, %d-byte header, %d bytes read", l.Size, l.DataOffset, read)
			if read > limit || read > l.DataOffset+readBuf {
				t.Errorf("read %d bytes, limit %d (header %d)", read, limit, l.DataOffset)
			}
			if len(f.Tensors) != len(l.Tensors) {
				t.Errorf("%d tensors", len(f.Tensors))
			}
		})
	}
}

// BenchmarkParseHeader parses the header of a 50 GB (sparse) GGUF file,
// with and without a 248320-token vocabulary.
func BenchmarkParseHeader(b *testing.B) {
	for _, vocab := range []int{0, 248320} {
		b.Run(fmt.Sprintf("vocab=%d", vocab), func(b *testing.B) {
			l := bigLayout(b, vocab)
			p := sparseFile(b, l)
			b.SetBytes(l.DataOffset)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := Open(p)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}
