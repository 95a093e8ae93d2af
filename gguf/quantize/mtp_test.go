package quantize

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/imatrix"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/tensor"
)

// moeMTP writes testmodel's qwen35moe checkpoint (experts stacked in 3-D
// tensors, an MTP block with experts) as an F16 GGUF in dir, and a legacy
// .dat importance matrix with an entry, ne0 values per expert, each
// expert's different, for every matrix of the trunk blocks — none for the
// MTP block, as llama-imatrix makes them.
func moeMTP(t *testing.T, dir string) (in, mat string) {
	t.Helper()
	in = familyF16(t, dir, "qwen35moe")
	f, err := gguf.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv, _ := f.KV("qwen35moe.block_count")
	blocks, _ := kv.Uint()
	kv, _ = f.KV("qwen35moe.nextn_predict_layers")
	nextn, _ := kv.Uint()
	if nextn == 0 {
		t.Fatal("the qwen35moe model has no MTP block")
	}
	mat = filepath.Join(dir, "moe.dat")
	syntheticMatrix(t, f, mat, 0, func(b int) bool { return uint64(b) < blocks-nextn })
	return in, mat
}

// syntheticMatrix writes a legacy .dat importance matrix at path with an
// entry for every matrix of f in the blocks keep accepts: ne0 values per
// expert, different for every expert and every salt.
func syntheticMatrix(t *testing.T, f *gguf.File, path string, salt int, keep func(block int) bool) {
	t.Helper()
	le := binary.LittleEndian
	var dat []byte
	n := 0
	for _, ti := range f.Tensors {
		b, ok := blockNum(ti.Name)
		if !ok || !keep(b) || len(ti.Dims) < 2 {
			continue
		}
		vals := int(ti.Dims[0])
		if len(ti.Dims) > 2 {
			vals *= int(ti.Dims[2])
		}
		dat = le.AppendUint32(dat, uint32(len(ti.Name)))
		dat = append(dat, ti.Name...)
		dat = le.AppendUint32(dat, 1) // ncall: the values are the importances
		dat = le.AppendUint32(dat, uint32(vals))
		for i := range vals {
			dat = le.AppendUint32(dat, math.Float32bits(float32(1+(i*7919+len(ti.Name)*31+salt)%97)/13))
		}
		n++
	}
	if err := os.WriteFile(path, append(le.AppendUint32(nil, uint32(n)), dat...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Two matrices with the same entries, names and sizes but other values
// plan the same header (the same quantize.imatrix.* KVs) and different
// resume stamps: a partial file quantized with one is not resumed with the
// other.
func TestImatrixStamp(t *testing.T) {
	dir := t.TempDir()
	f, err := gguf.Open(input("qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stamps []string
	var header []byte
	for salt := range 2 {
		path := filepath.Join(dir, fmt.Sprint(salt), "m.dat")
		os.Mkdir(filepath.Dir(path), 0o755)
		syntheticMatrix(t, f, path, salt, func(int) bool { return true })
		p, err := NewPlan(f, Options{FileType: quant.FileQ4_K_M, Imatrix: openMatrix(t, path), ImatrixFile: "m.dat"})
		if err != nil {
			t.Fatal(err)
		}
		if header != nil && !slices.Equal(header, p.Layout.Header) {
			t.Fatal("the headers differ")
		}
		header = p.Layout.Header
		stamps = append(stamps, Stamp(f, p))
	}
	if stamps[0] == stamps[1] {
		t.Error("the same stamp for two matrices")
	}
}

// tensorBytes reads a tensor's bytes from a GGUF file.
func tensorBytes(t *testing.T, f *gguf.File, name string) (gguf.TensorInfo, []byte) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("%s: no tensor %s", f.Path, name)
	}
	b := make([]byte, ti.Size())
	if _, err := f.Section(ti).ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return ti, b
}

// With experts stacked in one tensor, each expert's rows are quantized
// with that expert's slice of the entry (ne0 values each), as
// llama-quantize does: every expert tensor of the output is
// EncodeWeighted of its input, expert by expert, and differs from what
// expert 0's vector would give. The MTP block, which the matrix lacks,
// is quantized unweighted and listed as such.
func TestImatrixExperts(t *testing.T) {
	dir := t.TempDir()
	in, mat := moeMTP(t, dir)
	out := filepath.Join(dir, "out.gguf")
	p := quantizeFile(t, in, out, Options{FileType: quant.FileQ4_K_M, Imatrix: openMatrix(t, mat)}, RunOptions{Jobs: 2, ChunkElems: 1 << 10})
	f, err := gguf.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	experts, told := 0, 0
	for _, tp := range p.Tensors {
		if len(tp.In.Dims) < 3 || tp.In.Dims[2] < 2 || tp.Copy() {
			continue
		}
		if tp.Weights == nil {
			if b, _ := blockNum(tp.Name); b < int(p.Model.NLayerAll)-p.MTPLayers {
				t.Errorf("%s: quantized without its entry", tp.Name)
			}
			continue
		}
		experts++
		_, src := tensorBytes(t, f, tp.Name)
		_, got := tensorBytes(t, o, tp.Name)
		cols, rows := int(tp.In.Dims[0]), int(tp.In.Dims[1])
		vals := make([]float32, len(src)/2)
		tensor.F16ToF32(vals, src)
		per := len(got) / int(tp.In.Dims[2])
		for e := range int(tp.In.Dims[2]) {
			want := make([]byte, per)
			x := vals[e*rows*cols : (e+1)*rows*cols]
			if err := quant.EncodeWeighted(tp.Type, want, x, cols, tp.Weights[e*cols:(e+1)*cols]); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(want, got[e*per:(e+1)*per]) {
				t.Errorf("%s expert %d: not quantized with its own importance vector", tp.Name, e)
			}
			if e > 0 {
				quant.EncodeWeighted(tp.Type, want, x, cols, tp.Weights[:cols])
				if !slices.Equal(want, got[e*per:(e+1)*per]) {
					told++
				}
			}
		}
	}
	if experts == 0 || told == 0 {
		t.Fatalf("%d weighted expert tensors, %d experts whose bytes expert 0's vector would change: the test cannot tell", experts, told)
	}
	var mtp []string
	for _, n := range p.Unweighted {
		if b, ok := blockNum(n); ok && b >= int(p.Model.NLayerAll)-p.MTPLayers {
			mtp = append(mtp, n)
		}
	}
	if len(mtp) == 0 || !slices.ContainsFunc(mtp, func(n string) bool { return strings.Contains(n, "_exps") }) {
		t.Errorf("unweighted %q: want the MTP block's tensors, its experts included", p.Unweighted)
	}
	requireMTP(t, out)
}

// --mtp-type on the reference Qwen3.5 model and matrix (which lacks the
// MTP block, as every llama-imatrix output does): Q2_K_S is refused before
// anything is written, every MTP tensor named (TestImatrixRequired);
// --mtp-type Q8_0 makes it. On Q4_K_M, and on the MoE model with an MTP
// block, --mtp-type Q8_0 changes only the MTP block's quantizable tensors
// (to Q8_0; its norms stay F32): every other tensor has the bytes of the
// run without it, and verify mtp --require passes.
func TestMTPType(t *testing.T) {
	q8 := quant.Q8_0
	ref := openMatrix(t, matrixPath("qwen35", ".gguf"))
	dir := t.TempDir()
	kept := filepath.Join(dir, "q2ks.gguf")
	quantizeFile(t, input("qwen35"), kept, Options{FileType: quant.FileQ2_K_S, Imatrix: ref, MTPType: &q8}, RunOptions{Jobs: 2})
	requireMTP(t, kept)
	moeIn, moeMat := moeMTP(t, dir)
	for _, c := range []struct {
		name, in string
		m        *imatrix.Matrix
	}{{"qwen35", input("qwen35"), ref}, {"qwen35moe", moeIn, openMatrix(t, moeMat)}} {
		t.Run(c.name, func(t *testing.T) { mtpTypeOnly(t, c.in, c.m) })
	}
}

// mtpTypeOnly compares Q4_K_M of in with and without --mtp-type Q8_0.
func mtpTypeOnly(t *testing.T, in string, m *imatrix.Matrix) {
	q8 := quant.Q8_0
	dir := t.TempDir()
	plain, kept := filepath.Join(dir, "plain.gguf"), filepath.Join(dir, "kept.gguf")
	pp := quantizeFile(t, in, plain, Options{FileType: quant.FileQ4_K_M, Imatrix: m}, RunOptions{Jobs: 2})
	if pp.MTPLayers == 0 {
		t.Fatal("no MTP block")
	}
	pk := quantizeFile(t, in, kept, Options{FileType: quant.FileQ4_K_M, Imatrix: m, MTPType: &q8}, RunOptions{Jobs: 2})
	a, err := gguf.Open(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := gguf.Open(kept)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	first := int(pk.Model.NLayerAll) - pk.MTPLayers
	set := 0
	for i, tk := range pk.Tensors {
		tp := pp.Tensors[i]
		bn, ok := blockNum(tk.Name)
		switch {
		case !ok || bn < first:
			_, x := tensorBytes(t, a, tp.Name)
			_, y := tensorBytes(t, b, tk.Name)
			if tk.Type != tp.Type || !slices.Equal(x, y) || tk.By != "" {
				t.Errorf("%s: %s (%q), %s without --mtp-type", tk.Name, tk.Type, tk.By, tp.Type)
			}
		case tk.Copy():
			if tk.Type != tp.Type {
				t.Errorf("%s: %s, %s without --mtp-type", tk.Name, tk.Type, tp.Type)
			}
		default:
			set++
			if tk.Type != quant.Q8_0 || tk.By != "--mtp-type" {
				t.Errorf("%s: %s (%q), want Q8_0 by --mtp-type", tk.Name, tk.Type, tk.By)
			}
		}
		if ok && bn >= first && strings.Contains(tk.Name, "norm") && tk.Type != quant.F32 {
			t.Errorf("%s: %s, want F32", tk.Name, tk.Type)
		}
	}
	if set == 0 {
		t.Error("no MTP tensor set")
	}
	requireMTP(t, kept)
}
