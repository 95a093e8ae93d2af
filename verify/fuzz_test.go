package verify

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

// miniGGUF is a small well-formed GGUF with a one-block trunk and a NextN
// block (the fuzz seeds' shape; see testdata/fuzz/FuzzGGUF).
func miniGGUF(t testing.TB, withKey, withHead bool, qt quant.Type) []byte {
	t.Helper()
	kvs := []gguf.KV{gguf.Str("general.architecture", "qwen35"), gguf.U32("qwen35.block_count", 2), gguf.U32("qwen35.embedding_length", 8)}
	if withKey {
		kvs = append(kvs, gguf.U32("qwen35.nextn_predict_layers", 1))
	}
	q := gguf.TensorSpec{Dims: []uint64{256, 2}, Type: qt}
	specs := []gguf.TensorSpec{
		{Name: "token_embd.weight", Dims: []uint64{8, 16}, Type: quant.F16},
		{Name: "blk.0.attn_norm.weight", Dims: []uint64{8}, Type: quant.F32},
		{Name: "blk.0.attn_q.weight", Dims: q.Dims, Type: q.Type},
	}
	if withHead {
		specs = append(specs,
			gguf.TensorSpec{Name: "blk.1.attn_norm.weight", Dims: []uint64{8}, Type: quant.F32},
			gguf.TensorSpec{Name: "blk.1.attn_q.weight", Dims: q.Dims, Type: q.Type},
			gguf.TensorSpec{Name: "blk.1.nextn.eh_proj.weight", Dims: []uint64{16, 8}, Type: quant.F16},
			gguf.TensorSpec{Name: "blk.1.nextn.enorm.weight", Dims: []uint64{8}, Type: quant.F32},
			gguf.TensorSpec{Name: "blk.1.nextn.hnorm.weight", Dims: []uint64{8}, Type: quant.F32},
		)
	}
	l, err := gguf.PlanLayout(kvs, specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, l.Size)
	copy(out, l.Header)
	for i, ti := range l.Tensors {
		copy(out[l.TensorOffset(i):], healthy(ti.Type, ti.Size()))
	}
	return out
}

// FuzzGGUF: any byte string either fails with a bad-input error or yields a
// well-formed report; nothing panics, --deep included.
func FuzzGGUF(f *testing.F) {
	f.Add(miniGGUF(f, true, true, quant.Q4_K))
	f.Add(miniGGUF(f, true, false, quant.Q8_0))
	f.Add(miniGGUF(f, false, true, quant.F16))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, deep := range []bool{false, true} {
			r, err := GGUF(bytes.NewReader(data), int64(len(data)), "fuzz.gguf", Options{Deep: deep})
			checkFuzzResult(t, r, err)
		}
	})
}

// FuzzConfig: any config.json beside a real checkpoint either fails with a
// bad-input error or yields a well-formed report.
func FuzzConfig(f *testing.F) {
	m, err := testmodel.Qwen35MoEOptions{}.Write(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(filepath.Join(m.Dir, "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"num_hidden_layers": 4, "hidden_size": 64, "num_nextn_predict_layers": 3, "quantization": {"group_size": 64, "bits": 4, "mtp.fc": {"bits": 8}, "x": false}}`))
	f.Add([]byte(`{"text_config": {"num_hidden_layers": 2, "mtp_num_hidden_layers": 1}, "architectures": ["Qwen3_5ForConditionalGeneration"]}`))
	cfgPath := filepath.Join(m.Dir, "config.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(cfgPath, data, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, deep := range []bool{false, true} {
			r, err := MTP(m.Dir, Options{Deep: deep})
			checkFuzzResult(t, r, err)
		}
	})
}

func checkFuzzResult(t *testing.T, r *Report, err error) {
	t.Helper()
	if err != nil {
		var bi badInputErr
		if !errors.As(err, &bi) || !bi.BadInput() {
			t.Fatalf("error not marked bad input: %v", err)
		}
		if r != nil {
			t.Fatalf("report with an error")
		}
		return
	}
	switch r.Verdict {
	case OK, Absent, Dropped, Partial, Inconsistent:
	default:
		t.Fatalf("verdict %q", r.Verdict)
	}
	if r.Present > r.Expected || (r.Verdict == OK && len(r.Missing)+len(r.Problems) > 0) {
		t.Fatalf("incoherent report: %s", describe(r))
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}
