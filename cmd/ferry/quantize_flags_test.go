package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
)

var imatrixTestdata = filepath.Join("..", "..", "gguf", "imatrix", "testdata")

// imatrixDir is a directory holding the qwen3 reference matrix as
// imatrix.gguf and imatrix.dat, the names llama-quantize was given.
func imatrixDir(t *testing.T, model string) string {
	t.Helper()
	dir := t.TempDir()
	for _, ext := range []string{".gguf", ".dat"} {
		b, err := os.ReadFile(filepath.Join(imatrixTestdata, model+"-imatrix"+ext))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "imatrix"+ext), b, 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// `ferry quantize --imatrix imatrix.gguf` (run where the matrix is, as the
// golden's command was) writes llama-quantize's file byte for byte, and
// --json and the summary say which matrix and which tensors went without
// it; --tensor-type writes the override golden and the summary names it.
// From imatrix.dat every tensor and every KV is the same except
// quantize.imatrix.file, which is the matrix's name as given
// ("imatrix.dat": llama-quantize writes what it was given).
func TestQuantizeImatrixCLI(t *testing.T) {
	abs, err := filepath.Abs(qwen3F16)
	if err != nil {
		t.Fatal(err)
	}
	dir := imatrixDir(t, "qwen3")
	r := execFerryIn(t, dir, nil, "quantize", "--json", "--imatrix", "imatrix.gguf", abs, "out.gguf", "Q4_K_M")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	ref := filepath.Join(dir, "out.gguf")
	if d := fileDigest(t, ref); hex.EncodeToString(d[:]) != goldenSHA(t, "qwen3-imatrix-Q4_K_M") {
		t.Errorf("sha256 %x, llama-quantize's %s", d, goldenSHA(t, "qwen3-imatrix-Q4_K_M"))
	}
	var res quantizeResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	if m := res.Imatrix; m == nil || m.File != "imatrix.gguf" || m.Format != "gguf" || m.Entries != 14 || m.Chunks != 64 ||
		m.Dataset != "calib.txt" || m.Weighted != 14 || !slices.Equal(m.Unweighted, []string{"token_embd.weight"}) {
		t.Errorf("imatrix %+v", res.Imatrix)
	}
	for _, tl := range res.TensorList {
		if tl.Imatrix != (strings.HasPrefix(tl.Name, "blk.") && tl.OutputType != "F32") {
			t.Errorf("%s: imatrix %v", tl.Name, tl.Imatrix)
		}
	}

	r = execFerryIn(t, dir, nil, "quantize", "--imatrix", "imatrix.dat", abs, "dat.gguf", "Q4_K_M")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "imatrix: imatrix.dat (dat, 14 entries, 64 chunks, dataset calib.txt): 14 tensors weighted, 1 without an entry") {
		t.Errorf("summary: %s", r.stdout)
	}
	a, b := ggufParts(t, ref), ggufParts(t, filepath.Join(dir, "dat.gguf"))
	for i, kv := range a.kvs {
		if kv.Key == "quantize.imatrix.file" {
			kv.Value = "imatrix.dat"
		}
		if i >= len(b.kvs) || b.kvs[i].Key != kv.Key || !reflect.DeepEqual(b.kvs[i].Value, kv.Value) {
			t.Errorf("KV %d: %+v, want %+v", i, b.kvs[min(i, len(b.kvs)-1)], kv)
		}
	}
	if !bytes.Equal(a.data, b.data) || len(a.kvs) != len(b.kvs) {
		t.Error("the tensors from imatrix.dat differ from those from imatrix.gguf")
	}

	out := filepath.Join(dir, "tt.gguf")
	r = execFerry(t, nil, "quantize", "--tensor-type", "attn_v=q8_0", "--tensor-type", "FFN_DOWN=Q5_K", qwen3F16, out, "Q4_K_M")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if d := fileDigest(t, out); hex.EncodeToString(d[:]) != goldenSHA(t, "qwen3-base-Q4_K_M-attnv_q8_0-ffndown_q5_k") {
		t.Errorf("--tensor-type: sha256 %x, llama-quantize's %s", d, goldenSHA(t, "qwen3-base-Q4_K_M-attnv_q8_0-ffndown_q5_k"))
	}
	for _, want := range []string{"override --tensor-type attn_v: 2 tensors → Q8_0 (blk.0.attn_v.weight, blk.1.attn_v.weight)",
		"override --tensor-type FFN_DOWN: 2 tensors → Q5_K"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("summary lacks %q: %s", want, r.stdout)
		}
	}
}

type ggufSections struct {
	kvs  []gguf.KV
	data []byte
}

// ggufParts reads a GGUF file's KVs and its tensor data section.
func ggufParts(t *testing.T, path string) ggufSections {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f.ReaderAt(), f.DataOffset, f.Size-f.DataOffset))
	if err != nil {
		t.Fatal(err)
	}
	return ggufSections{kvs: f.KVs, data: data}
}

// The imatrix and override flags' usage errors, and a matrix that does not
// fit or lacks entries a Q2_K_S file needs: exit 2, a message naming the
// problem, nothing written.
func TestQuantizeImatrixCLIErrors(t *testing.T) {
	dir := imatrixDir(t, "qwen3")
	m35 := imatrixDir(t, "qwen35")
	qwen35F16 := filepath.Join(quantTestdata, "qwen35-base-F16.gguf")
	out := filepath.Join(dir, "out.gguf")
	bad := filepath.Join(dir, "bad.dat")
	os.WriteFile(bad, []byte{1, 0, 0, 0, 200, 0, 0, 0, 'x'}, 0o644)
	// A legacy matrix whose one entry has 4 values for rows of 512.
	short := filepath.Join(dir, "short.dat")
	name := "blk.0.ffn_down.weight"
	le := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	dat := slices.Concat(le(1), le(uint32(len(name))), []byte(name), le(1), le(4), make([]byte, 16))
	os.WriteFile(short, dat, 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"Q2_K_S without --imatrix", []string{qwen3F16, out, "Q2_K_S"}, []string{"requires an importance matrix", "needs --imatrix"}},
		{"include and exclude", []string{"--imatrix", dir + "/imatrix.gguf", "--include-weights", "attn", "--exclude-weights", "ffn", qwen3F16, out, "Q4_K_M"}, []string{"cannot be used together"}},
		{"exclude without imatrix", []string{"--exclude-weights", "ffn", qwen3F16, out, "Q4_K_M"}, []string{"none given"}},
		{"missing matrix", []string{"--imatrix", dir + "/nope.gguf", qwen3F16, out, "Q4_K_M"}, []string{"nope.gguf"}},
		{"truncated matrix", []string{"--imatrix", bad, qwen3F16, out, "Q4_K_M"}, []string{bad}},
		{"matrix entry of another size", []string{"--imatrix", short, qwen3F16, out, "Q4_K_M"}, []string{short, "imatrix size 4 is different from tensor size 512", "blk.0.ffn_down.weight"}},
		{"tensor type without =", []string{"--tensor-type", "attn_v", qwen3F16, out, "Q4_K_M"}, []string{`"attn_v"`, "PATTERN=TYPE"}},
		{"tensor type unknown", []string{"--tensor-type", "attn_v=q9_k", qwen3F16, out, "Q4_K_M"}, []string{`"q9_k"`}},
		{"tensor type bad regex", []string{"--tensor-type", "attn_(v=q8_0", qwen3F16, out, "Q4_K_M"}, []string{"attn_(v"}},
		{"mtp type without MTP", []string{"--mtp-type", "q8_0", qwen3F16, out, "Q4_K_M"}, []string{"no NextN/MTP layers"}},
		{"bad mtp type", []string{"--mtp-type", "iq2_xs", qwen35F16, out, "Q4_K_M"}, []string{"--mtp-type", `"iq2_xs"`}},
		{"Q2_K_S and an MTP block without entries", []string{"--imatrix", m35 + "/imatrix.dat", qwen35F16, out, "Q2_K_S"},
			[]string{"8 tensors", "MTP/NextN tensors", "blk.4.nextn.eh_proj.weight", "--mtp-type Q8_0"}},
	} {
		t.Run(tc.name, func(t *testing.T) { quantizeRefused(t, out, tc.args, tc.want) })
	}
}
