package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/quant"
	"github.com/ferry-llm/ferry/internal/testmodel"
)

const quantTestdata = "../../gguf/quant/testdata"

var qwen3F16 = filepath.Join(quantTestdata, "qwen3-base-F16.gguf")

func goldenSHA(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(quantTestdata, "golden", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct{ SHA256 string }
	if err := json.Unmarshal(b, &g); err != nil || len(g.SHA256) != 64 {
		t.Fatalf("%s: sha256 %q, %v", name, g.SHA256, err)
	}
	return g.SHA256
}

// `ferry quantize IN OUT TYPE [NTHREADS]` writes llama-quantize's file,
// byte for byte, whatever the spelling of the type, --jobs or the trailing
// thread count; --json lists every tensor and the totals.
func TestQuantizeCLI(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, golden string
		args         []string
	}{
		{"json", "Q8_0", []string{"--json", qwen3F16, "OUT", "Q8_0"}},
		{"lower case, nthreads", "Q8_0", []string{qwen3F16, "OUT", "q8_0", "1"}},
		{"flags after", "Q8_0", []string{qwen3F16, "OUT", "Q8_0", "--jobs", "3"}},
		{"alias", "Q4_K_M", []string{qwen3F16, "OUT", "q4_k"}},
		{"pure", "Q4_K_M-pure", []string{"--pure", qwen3F16, "OUT", "Q4_K_M"}},
		{"output and embedding types", "Q4_K_M-out_q8_0-embd_q8_0", []string{qwen3F16, "OUT", "Q4_K_M", "--output-tensor-type", "q8_0", "--token-embedding-type", "Q8_0"}},
		{"no-sync", "Q4_K_M", []string{"--no-sync", qwen3F16, "OUT", "Q4_K_M"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".gguf")
			args := append([]string{"quantize"}, tc.args...)
			for i, a := range args {
				if a == "OUT" {
					args[i] = out
				}
			}
			r := execFerry(t, nil, args...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			want := goldenSHA(t, "qwen3-base-"+tc.golden)
			if d := fileDigest(t, out); hex.EncodeToString(d[:]) != want {
				t.Errorf("sha256 %x, llama-quantize's %s", d, want)
			}
			if tc.name != "json" {
				if !strings.Contains(r.stdout, out+": ") || !strings.Contains(r.stdout, " (qwen3), 24 tensors (15 quantized)") {
					t.Errorf("stdout %q", r.stdout)
				}
				if noSync := slices.Contains(tc.args, "--no-sync"); noSync != strings.Contains(r.stdout, "(not fsynced: --no-sync)") {
					t.Errorf("--no-sync %v, stdout %q", noSync, r.stdout)
				}
				return
			}
			var res quantizeResult
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("%v: %s", err, r.stdout)
			}
			if res.Type != "Q8_0" || res.FileType != 7 || res.Tensors != 24 || res.Quantized != 15 || len(res.TensorList) != 24 || res.Bytes != 1412000 {
				t.Errorf("result %+v", res)
			}
			first := res.TensorList[1]
			if first.Name != "token_embd.weight" || first.InputType != "F16" || first.OutputType != "Q8_0" ||
				len(first.Shape) != 2 || first.Shape[0] != 256 || first.Shape[1] != 512 || first.Bytes != 512*8*34 {
				t.Errorf("tensor 1: %+v", first)
			}
		})
	}
}

// Bad input and usage errors exit 2 with a message naming the file (and
// tensor or key), and leave nothing: no output, no partial file, no
// journal, no lock.
func TestQuantizeCLIErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.gguf")
	b, err := os.ReadFile(qwen3F16)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated.gguf")
	os.WriteFile(truncated, b[:len(b)-4096], 0o644)
	// A header promising a NextN layer (block 1 of 2) with no tensors for it.
	noNextN := filepath.Join(dir, "no-nextn.gguf")
	l, err := gguf.PlanLayout([]gguf.KV{
		{Key: "general.architecture", Type: gguf.ValueString, Value: "qwen35"},
		{Key: "qwen35.block_count", Type: gguf.ValueUint32, Value: uint32(2)},
		{Key: "qwen35.nextn_predict_layers", Type: gguf.ValueUint32, Value: uint32(1)},
	}, []gguf.TensorSpec{{Name: "blk.0.ffn_up.weight", Dims: []uint64{256, 4}, Type: quant.F16}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := gguf.Create(noNextN, l, gguf.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.WriteTensorBytes(0, make([]byte, 2048))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.gguf")
	os.Symlink("in.gguf", link)
	out := filepath.Join(dir, "out.gguf")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"two arguments", []string{in, out}, []string{"want IN.gguf OUT.gguf TYPE"}},
		{"five arguments", []string{in, out, "Q8_0", "2", "x"}, []string{"want IN.gguf OUT.gguf TYPE"}},
		{"unknown type", []string{in, out, "Q9_K"}, []string{`"Q9_K"`, "Q4_K_M"}},
		{"imatrix type", []string{in, out, "Q2_K_S"}, []string{"importance matrix"}},
		{"bad nthreads", []string{in, out, "Q8_0", "many"}, []string{`NTHREADS "many"`}},
		{"nthreads and --jobs disagree", []string{"--jobs", "3", in, out, "Q8_0", "2"}, []string{"disagree"}},
		{"bad --output-tensor-type", []string{"--output-tensor-type", "q9", in, out, "Q8_0"}, []string{"--output-tensor-type"}},
		{"missing input", []string{filepath.Join(dir, "nope.gguf"), out, "Q8_0"}, []string{"nope.gguf"}},
		{"truncated input", []string{truncated, out, "Q8_0"}, []string{truncated, "tensor \"", "past the end"}},
		{"nextn promised, missing", []string{noNextN, out, "Q8_0"}, []string{noNextN, "qwen35.nextn_predict_layers", "blk.1.nextn.eh_proj.weight"}},
		{"output over the input", []string{in, in, "Q8_0"}, []string{"output over an input"}},
		{"output over the input through a link", []string{in, link, "Q8_0"}, []string{"output over an input"}},
		{"output directory missing", []string{in, filepath.Join(dir, "no", "out.gguf"), "Q8_0"}, []string{"does not exist"}},
	} {
		t.Run(tc.name, func(t *testing.T) { quantizeRefused(t, out, tc.args, tc.want) })
	}
	if fileDigest(t, in) != sha256.Sum256(b) {
		t.Error("the input changed")
	}
}

// quantizeRefused runs `ferry quantize args` and checks that it exits 2
// with a message saying every want, leaving nothing at out.
func quantizeRefused(t *testing.T, out string, args, want []string) {
	t.Helper()
	r := execFerry(t, nil, append([]string{"quantize"}, args...)...)
	if r.code != exitBadInput {
		t.Errorf("exit %d, want %d: %s", r.code, exitBadInput, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not say %q: %s", w, r.stderr)
		}
	}
	for _, p := range []string{out, out + ".partial", out + ".journal", out + ".lock"} {
		if exists(p) {
			t.Errorf("the refused run left %s", p)
		}
	}
}

// `ferry quantize --help` shows the argument order and the flags.
func TestQuantizeHelp(t *testing.T) {
	s, code, err := runFerry(t, "quantize", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %v\n%s", code, err, s)
	}
	for _, want := range []string{"IN.gguf OUT.gguf TYPE [NTHREADS]", "--allow-requantize", "--output-tensor-type TYPE",
		"--token-embedding-type TYPE", "--leave-output-tensor", "--pure", "--jobs", "--json", "--lock-wait DURATION", "resumes",
		"--imatrix FILE", "--include-weights NAME", "--exclude-weights NAME", "--tensor-type REGEX=TYPE", "--mtp-type TYPE"} {
		if !strings.Contains(s, want) {
			t.Errorf("help lacks %q:\n%s", want, s)
		}
	}
}

// A quantization that fails for want of space leaves nothing (the file
// size limit fails the reservation of OUT.partial as a full disk does).
func TestQuantizeNoSpaceLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	noSpaceLeavesNothing(t, dir, "quantize", qwen3F16, filepath.Join(dir, "m.gguf"), "Q8_0")
}

// A real Ctrl-C: SIGINT to `ferry quantize` while it writes exits 130,
// leaves OUT.partial and OUT.journal and no OUT, says how to resume, and
// the same command then finishes with the bytes of an uninterrupted run.
func TestQuantizeSIGINT(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.gguf")
	// ~80 MB of F16: long enough (one worker) for the signal to land mid-write.
	o := testmodel.GGUFOptions{Layers: 2, NextN: true, Hidden: 1024, FF: 4096, Vocab: 8192, Heads: 8, KVHeads: 2, HeadDim: 128}
	if _, err := o.WriteGGUF(in); err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join(dir, "ref.gguf")
	r := execFerry(t, nil, "quantize", "--json", "--jobs", "1", in, ref, "Q8_0")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var refRes quantizeResult
	if err := json.Unmarshal([]byte(r.stdout), &refRes); err != nil {
		t.Fatal(err)
	}
	want := fileDigest(t, ref)
	out := filepath.Join(dir, "m.gguf")
	stderr, code := sigintChild(t, func() bool { return exists(out + ".partial") }, func() bool { return exists(out) },
		func() { os.Remove(out) }, time.Duration(refRes.Seconds/3*float64(time.Second)), "quantize", "--jobs", "1", in, out, "Q8_0")
	if code != exitInterrupted {
		t.Errorf("interrupted quantization exited %d, want %d: %s", code, exitInterrupted, stderr)
	}
	if !strings.Contains(stderr, "interrupted; ") || !strings.Contains(stderr, "run the same command again to resume") {
		t.Errorf("stderr does not say how to resume:\n%s", stderr)
	}
	checkInterrupted(t, stderr)
	if exists(out) {
		t.Fatalf("%s exists after the interrupt", out)
	}
	for _, p := range []string{out + ".partial", out + ".journal"} {
		if !exists(p) {
			t.Fatalf("interrupted run left no %s", p)
		}
	}
	if exists(out + ".lock") {
		t.Error("the interrupted run left its output lock")
	}
	r = execFerry(t, nil, "quantize", "--json", "--jobs", "2", in, out, "Q8_0")
	if r.code != 0 {
		t.Fatalf("resume: exit %d: %s", r.code, r.stderr)
	}
	var res quantizeResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("interrupt: %s; resumed %d of %d tensors", strings.TrimSpace(stderr), res.Resumed, res.Tensors)
	if fileDigest(t, out) != want {
		t.Error("resumed output differs from an uninterrupted quantization")
	}
	for _, p := range []string{out + ".partial", out + ".journal"} {
		if exists(p) {
			t.Errorf("%s left after the resumed run", p)
		}
	}
}
