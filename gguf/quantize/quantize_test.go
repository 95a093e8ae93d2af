package quantize

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/errkind"
	"github.com/ferry-llm/ferry/verify"
)

// tensorData is a tensor to write with writeGGUF.
type tensorData struct {
	spec gguf.TensorSpec
	data []byte
}

// writeGGUF writes a GGUF file of kvs and tensors to path.
func writeGGUF(t testing.TB, path string, kvs []gguf.KV, ts []tensorData, alignment uint64) {
	t.Helper()
	specs := make([]gguf.TensorSpec, len(ts))
	for i, x := range ts {
		specs[i] = x.spec
	}
	l, err := gguf.PlanLayout(kvs, specs, alignment)
	if err != nil {
		t.Fatal(err)
	}
	w, err := gguf.Create(path, l, gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range ts {
		if err := w.WriteTensorBytes(i, x.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// rewrite writes in's KVs and tensors to out through edit, which may
// change the KVs and drop or change tensors (keep false drops one).
func rewrite(t testing.TB, in, out string, kv func([]gguf.KV) []gguf.KV, edit func(ti *gguf.TensorInfo, data []byte) ([]byte, bool)) {
	t.Helper()
	f, err := gguf.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kvs := f.KVs
	if kv != nil {
		kvs = kv(append([]gguf.KV(nil), kvs...))
	}
	var ts []tensorData
	for _, ti := range f.Tensors {
		data, err := io.ReadAll(f.Section(ti))
		if err != nil {
			t.Fatal(err)
		}
		keep := true
		if edit != nil {
			data, keep = edit(&ti, data)
		}
		if keep {
			ts = append(ts, tensorData{gguf.TensorSpec{Name: ti.Name, Dims: ti.Dims, Type: ti.Type}, data})
		}
	}
	writeGGUF(t, out, kvs, ts, f.Alignment)
}

func plan(t testing.TB, in string, o Options) (*gguf.File, *Plan, error) {
	t.Helper()
	f, err := gguf.Open(in)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { f.Close() })
	p, err := NewPlan(f, o)
	return f, p, err
}

// The output does not depend on the worker count or the row-block size.
func TestDeterministicJobs(t *testing.T) {
	dir := t.TempDir()
	var ref []byte
	for _, c := range []struct {
		jobs  int
		chunk int64
	}{{1, 0}, {3, 256}, {2, 1000}, {8, 1}} {
		out := filepath.Join(dir, "out.gguf")
		quantizeFile(t, input("qwen35"), out, Options{FileType: quant.FileQ8_0}, RunOptions{Jobs: c.jobs, ChunkElems: c.chunk})
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if ref == nil {
			ref = b
		} else if !bytes.Equal(b, ref) {
			t.Errorf("jobs %d, chunk %d: output differs from jobs 1", c.jobs, c.chunk)
		}
		os.Remove(out)
	}
}

// A run cancelled after some tensors leaves out.partial and the journal;
// the same Run resumes them (writing only the tensors not durable) into a
// file byte-identical to an uninterrupted run, and leaves only the file. A
// plan for another type starts over.
func TestResume(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref.gguf")
	quantizeFile(t, input("qwen35"), ref, Options{FileType: quant.FileQ8_0}, RunOptions{Jobs: 1})
	want, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.gguf")
	f, p, err := plan(t, input("qwen35"), Options{FileType: quant.FileQ8_0})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Int32
	rr, err := Run(ctx, f, p, out, RunOptions{Jobs: 1, TensorDone: func(int, string) {
		if done.Add(1) == 30 {
			cancel()
		}
	}})
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	if rr.Partial == "" || rr.Durable < 30 {
		t.Fatalf("cancelled run left %+v, want a partial file with ≥ 30 durable tensors", rr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("%s exists after the interrupt (%v)", out, err)
	}
	rr, err = Run(context.Background(), f, p, out, RunOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rr.Resumed < 30 {
		t.Errorf("resumed %d tensors, want ≥ 30", rr.Resumed)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("resumed output differs from an uninterrupted run")
	}
	for _, p := range []string{out + ".partial", out + ".journal"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", p, err)
		}
	}
}

// Bad input is refused by NewPlan (or gguf.Open), before anything is
// written, with an error that names the file and the tensor or key, of
// the kind that exits 2.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	f16 := input("qwen3")
	path := func(name string) string { return filepath.Join(dir, name) }
	st, err := os.Stat(f16)
	if err != nil {
		t.Fatal(err)
	}

	truncated := path("truncated.gguf")
	b, _ := os.ReadFile(f16)
	os.WriteFile(truncated, b[:4000], 0o644)
	pastEOF := path("past-eof.gguf")
	os.WriteFile(pastEOF, b[:st.Size()-1000], 0o644)

	i32 := path("i32.gguf")
	llama := []gguf.KV{{Key: "general.architecture", Type: gguf.ValueString, Value: "llama"}, {Key: "llama.block_count", Type: gguf.ValueUint32, Value: uint32(1)}}
	writeGGUF(t, i32, llama,
		[]tensorData{{gguf.TensorSpec{Name: "blk.0.ffn_up.weight", Dims: []uint64{32, 2}, Type: quant.I32}, make([]byte, 256)}}, 0)

	noBlocks := path("no-block-count.gguf")
	writeGGUF(t, noBlocks, llama[:1], []tensorData{{gguf.TensorSpec{Name: "blk.0.ffn_up.weight", Dims: []uint64{32, 2}, Type: quant.F32}, make([]byte, 256)}}, 0)

	q8 := path("q8.gguf")
	quantizeFile(t, f16, q8, Options{FileType: quant.FileQ8_0}, RunOptions{Jobs: 1})

	noNextN := path("no-nextn.gguf")
	rewrite(t, input("qwen35"), noNextN, nil, func(ti *gguf.TensorInfo, data []byte) ([]byte, bool) {
		return data, !strings.Contains(ti.Name, ".nextn.")
	})
	noEh := path("no-eh-proj.gguf")
	rewrite(t, input("qwen35"), noEh, nil, func(ti *gguf.TensorInfo, data []byte) ([]byte, bool) {
		return data, ti.Name != "blk.4.nextn.eh_proj.weight"
	})

	for _, tc := range []struct {
		name, in string
		o        Options
		is       error
		want     []string // in the message
	}{
		{"truncated header", truncated, Options{FileType: quant.FileQ8_0}, gguf.ErrTruncated, []string{truncated}},
		{"tensor data past EOF", pastEOF, Options{FileType: quant.FileQ8_0}, gguf.ErrDataRange, []string{pastEOF, `tensor "`}},
		{"I32 matrix", i32, Options{FileType: quant.FileQ8_0}, ErrInputType, []string{i32, `tensor "blk.0.ffn_up.weight"`, "I32"}},
		{"no block_count", noBlocks, Options{FileType: quant.FileQ8_0}, ErrModel, []string{noBlocks, "llama.block_count"}},
		{"quantized input", q8, Options{FileType: quant.FileQ8_0, TokenEmbdType: typePtr(quant.F16)}, ErrRequantize, []string{q8, `tensor "token_embd.weight"`, "--allow-requantize"}},
		{"nextn promised, stripped", noNextN, Options{FileType: quant.FileQ8_0}, ErrMTPMissing, []string{noNextN, "qwen35.nextn_predict_layers", "blk.4.nextn.eh_proj.weight"}},
		{"nextn eh_proj missing", noEh, Options{FileType: quant.FileQ8_0}, ErrMTPMissing, []string{"blk.4.nextn.eh_proj.weight"}},
		{"needs an imatrix", f16, Options{FileType: quant.FileQ2_K_S}, quant.ErrNeedsImatrix, []string{"importance matrix", "--imatrix"}},
		{"unknown file type", f16, Options{FileType: 99}, ErrFileType, []string{"99"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := plan(t, tc.in, tc.o)
			if !errors.Is(err, tc.is) {
				t.Fatalf("err %v, want %v", err, tc.is)
			}
			if k := errkind.Of(err); k != errkind.BadInput && k != errkind.Usage {
				t.Errorf("kind %s, want bad input or usage (exit 2)", k)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := ParseType("Q9_K"); !errors.Is(err, ErrFileType) || errkind.Of(err) != errkind.Usage {
		t.Errorf("ParseType(Q9_K): %v", err)
	}
	// Q2_K_S parses; NewPlan refuses it without a matrix (TestImatrixRequired).
	if ft, err := ParseType("q2_k_s"); err != nil || ft != quant.FileQ2_K_S {
		t.Errorf("ParseType(q2_k_s): %v, %v", ft, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 7 {
		t.Errorf("%d files in the test directory, want the 7 inputs: a refused plan wrote something", len(ents))
	}
}

// Re-quantizing with AllowRequantize decodes the quantized tensors first:
// a Q8_0 file quantized to Q4_K_M is what the same type makes of its
// decoded values written as F32; and a tensor that only changes to F16
// (--token-embedding-type) goes through the same decoding.
func TestAllowRequantize(t *testing.T) {
	dir := t.TempDir()
	q8 := filepath.Join(dir, "q8.gguf")
	quantizeFile(t, input("qwen3"), q8, Options{FileType: quant.FileQ8_0}, RunOptions{Jobs: 1})
	// The same values as F32.
	f32 := filepath.Join(dir, "f32.gguf")
	rewrite(t, q8, f32, nil, func(ti *gguf.TensorInfo, data []byte) ([]byte, bool) {
		if ti.Type != quant.Q8_0 {
			return data, true
		}
		v := make([]float32, ti.NumElements())
		if err := quant.Decode(quant.Q8_0, v, data); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, 4*len(v))
		if err := quant.Encode(quant.F32, out, v); err != nil {
			t.Fatal(err)
		}
		ti.Type = quant.F32
		return out, true
	})
	for _, o := range []Options{
		{FileType: quant.FileQ4_K_M},
		{FileType: quant.FileQ8_0, TokenEmbdType: typePtr(quant.F16)},
	} {
		if _, _, err := plan(t, q8, o); !errors.Is(err, ErrRequantize) {
			t.Fatalf("%s without AllowRequantize: %v", o.FileType, err)
		}
		o.AllowRequantize = true
		a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
		quantizeFile(t, q8, a, o, RunOptions{Jobs: 2, ChunkElems: 512})
		quantizeFile(t, f32, b, o, RunOptions{Jobs: 2})
		ga, _ := os.ReadFile(a)
		gb, _ := os.ReadFile(b)
		if !bytes.Equal(ga, gb) {
			t.Errorf("%s: re-quantized output differs from quantizing the decoded values", o.FileType)
		}
	}
}

// The NextN (MTP) head of a Qwen3.5 GGUF survives every type: `ferry
// verify mtp --require --deep` passes on each output (here the types with
// no qwen35 golden; the golden tests check theirs, and that their bytes
// are llama-quantize's), and fails on the input with its nextn tensors
// stripped (which the quantizer refuses, TestBadInput).
func TestMTPSurvives(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"Q8_0", "Q5_K_S", "Q4_K_S", "Q3_K_L", "Q3_K_S"} {
		ft, err := ParseType(name)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, name+".gguf")
		quantizeFile(t, input("qwen35"), out, Options{FileType: ft}, RunOptions{Jobs: 2})
		rep, err := verify.MTP(out, verify.Options{Require: true, Deep: true})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Pass(true) || rep.Promised != 1 {
			t.Errorf("%s: verify mtp --require --deep: %s, %d promised: %+v", name, rep.Verdict, rep.Promised, rep)
		}
		os.Remove(out)
	}
	stripped := filepath.Join(dir, "stripped.gguf")
	rewrite(t, input("qwen35"), stripped, nil, func(ti *gguf.TensorInfo, data []byte) ([]byte, bool) {
		return data, !strings.Contains(ti.Name, ".nextn.")
	})
	rep, err := verify.MTP(stripped, verify.Options{Require: true})
	if err == nil && rep.Pass(true) {
		t.Errorf("verify mtp --require passes a file with the nextn tensors stripped: %+v", rep)
	}
}

// An infinity or a NaN in a tensor that is quantized gives a non-finite
// scale; llama-quantize checks every quantized block
// (ggml_validate_row_data) and fails the run, and so does Run, naming the
// tensor and the row, with nothing under the output's name. A NaN that
// does not reach a scale (Q8_0's max skips it) is quantized as llama-quantize does.
func TestNonFiniteRefused(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		bits  uint16 // the half written at value 300 of blk.0.attn_q.weight (row 1)
		ft    quant.FileType
		fails bool
	}{
		{"inf Q8_0", 0x7C00, quant.FileQ8_0, true},
		{"-inf Q4_K_M", 0xFC00, quant.FileQ4_K_M, true},
		{"nan mid-block Q8_0", 0x7E00, quant.FileQ8_0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := filepath.Join(dir, tc.name+".gguf")
			rewrite(t, input("qwen3"), in, nil, func(ti *gguf.TensorInfo, data []byte) ([]byte, bool) {
				if ti.Name == "blk.0.attn_q.weight" {
					data = append([]byte(nil), data...)
					binary.LittleEndian.PutUint16(data[2*300:], tc.bits)
				}
				return data, true
			})
			f, p, err := plan(t, in, Options{FileType: tc.ft})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, tc.name+"-out.gguf")
			_, err = Run(context.Background(), f, p, out, RunOptions{Jobs: 2})
			if !tc.fails {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrNonFinite) || errkind.Of(err) != errkind.BadInput {
				t.Fatalf("err %v (kind %s), want ErrNonFinite, bad input", err, errkind.Of(err))
			}
			for _, w := range []string{in, `tensor "blk.0.attn_q.weight"`, "row 1 "} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("an output was left under the final name")
			}
		})
	}
}
