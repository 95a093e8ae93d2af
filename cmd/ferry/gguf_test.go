package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/gguf/convert"
	"github.com/ferry-llm/ferry/inspect"
	"github.com/ferry-llm/ferry/internal/hashing"
	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
	"github.com/ferry-llm/ferry/tensor"
	"github.com/ferry-llm/ferry/verify"
)

func TestGGUFConvertCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	r := execFerry(t, nil, "gguf", "convert", "--out", out, "--json", bundledBase)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var res ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if res.Architecture != "qwen35" || res.Tensors != 71 || res.MTPLayers != 1 || res.Out != out || len(res.Warnings) != 0 || res.NoSync {
		t.Errorf("result %+v", res)
	}
	// --no-sync: the same bytes, said in the result.
	unsynced := filepath.Join(t.TempDir(), "m.gguf")
	r = execFerry(t, nil, "gguf", "convert", "--no-sync", "--out", unsynced, "--json", bundledBase)
	var res2 ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &res2); r.code != 0 || err != nil || !res2.NoSync {
		t.Errorf("--no-sync: exit %d, %v, result %s", r.code, err, r.stdout)
	}
	if fileDigest(t, unsynced) != fileDigest(t, out) {
		t.Error("--no-sync wrote other bytes")
	}
	f, err := gguf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	// inspect reads it back: KV table, tensor table, the MTP block.
	r = execFerry(t, nil, "inspect", "--json", out)
	if r.code != 0 {
		t.Fatalf("inspect: exit %d: %s", r.code, r.stderr)
	}
	var rep inspect.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Format != "gguf" || rep.Summary.Tensors != 71 || !rep.Summary.MTP.Present || rep.Summary.MTP.NextNTensors != 15 {
		t.Errorf("inspect summary %+v", rep.Summary)
	}
	var bc any
	for _, kv := range rep.Metadata {
		if kv.Key == "qwen35.block_count" {
			if kv.Type != "UINT32" {
				t.Errorf("block_count type %s", kv.Type)
			}
			bc = kv.Value
		}
	}
	if bc != float64(5) {
		t.Errorf("block_count %v", bc)
	}
	r = execFerry(t, nil, "inspect", out)
	if r.code != 0 || !strings.Contains(r.stdout, "tokenizer.ggml.pre") || !strings.Contains(r.stdout, "ARRAY[STRING]") || !strings.Contains(r.stdout, "blk.4.nextn.eh_proj.weight") {
		t.Errorf("inspect text: exit %d\n%s", r.code, r.stdout)
	}

	// --no-mtp; an output directory gets the converter's file name.
	r = execFerry(t, nil, "gguf", "convert", "--no-mtp", "--out", dir, bundledBase)
	if r.code != 0 {
		t.Fatalf("--no-mtp: exit %d: %s", r.code, r.stderr)
	}
	f, err = gguf.Open(filepath.Join(dir, "Base-2.9M-F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if kv, _ := f.KV("qwen35.block_count"); kv.Value != uint32(4) {
		t.Errorf("--no-mtp block_count %v", kv.Value)
	}
	f.Close()
	r = execFerry(t, nil, "gguf", "convert", "--mtp-only", "--out", dir, bundledBase)
	if _, err := os.Stat(filepath.Join(dir, "mtp-Base-F16.gguf")); r.code != 0 || err != nil {
		t.Errorf("--mtp-only: exit %d, %v: %s", r.code, err, r.stderr)
	}
}

func TestGGUFConvertCLIErrors(t *testing.T) {
	merged := t.TempDir()
	if _, err := (testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}}).Write(merged); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "x.gguf")
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"MTP promised, tensors missing", []string{"gguf", "convert", "--out", out, merged}, 2, "--no-mtp"},
		{"no --out", []string{"gguf", "convert", bundledBase}, 2, "--out"},
		{"bad outtype", []string{"gguf", "convert", "--outtype", "q4_k", "--out", out, bundledBase}, 2, "outtype"},
		{"both MTP flags", []string{"gguf", "convert", "--no-mtp", "--mtp-only", "--out", out, bundledBase}, 2, "exclude"},
		{"missing dir", []string{"gguf", "convert", "--out", out, filepath.Join(dir, "nope")}, 2, "nope"},
		{"no subcommand", []string{"gguf"}, 2, "convert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := execFerry(t, nil, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.msg) {
				t.Errorf("exit %d, want %d; stderr %q should mention %q", r.code, tt.code, r.stderr, tt.msg)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("wrote %v", ents)
			}
		})
	}
	// The same checkpoint converts with --no-mtp.
	r := execFerry(t, nil, "gguf", "convert", "--no-mtp", "--out", out, merged)
	if r.code != 0 {
		t.Errorf("--no-mtp: exit %d: %s", r.code, r.stderr)
	}
}

// interruptConvert leaves what a Ctrl-C'd `ferry gguf convert DIR --out
// out` leaves after n tensors: out.partial and out.journal.
func interruptConvert(t *testing.T, dir, out string, n int) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	p, err := convert.NewPlan(ck, convert.Options{OutType: convert.OutF16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var done atomic.Int32
	_, err = convert.Run(ctx, ck, p, out, convert.RunOptions{Jobs: 1, TensorDone: func(int, string) {
		if done.Add(1) == int32(n) {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted write: %v", err)
	}
}

// An interrupted conversion resumes: the same command writes only the
// tensors the journal does not hold, the result is byte-identical to an
// uninterrupted run, and the journal and partial file are gone. Other
// options start over.
func TestGGUFConvertResume(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "ref.gguf")
	if r := execFerry(t, nil, "gguf", "convert", "--out", ref, bundledBase); r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	want, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name        string
		args        []string
		wantResumed bool
	}{
		{"same command", nil, true},
		{"other outtype", []string{"--outtype", "bf16"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "m.gguf")
			interruptConvert(t, bundledBase, out, 20)
			r := execFerry(t, nil, append([]string{"gguf", "convert", "--json", "--out", out, bundledBase}, tc.args...)...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			var res ggufConvertResult
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("%v: %s", err, r.stdout)
			}
			if tc.wantResumed && res.Resumed < 20 {
				t.Errorf("resumed %d tensors, want ≥ 20 (the journal holds 20)", res.Resumed)
			}
			if !tc.wantResumed && res.Resumed != 0 {
				t.Errorf("resumed %d tensors of another conversion", res.Resumed)
			}
			for _, leftover := range []string{out + ".journal", out + ".partial"} {
				if _, err := os.Stat(leftover); !os.IsNotExist(err) {
					t.Errorf("%s left behind (%v)", leftover, err)
				}
			}
			if tc.wantResumed {
				got, err := os.ReadFile(out)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Error("resumed output differs from an uninterrupted conversion")
				}
			}
		})
	}
}

// A real Ctrl-C: SIGINT to `ferry gguf convert` while it writes leaves
// FILE.partial and FILE.journal and no FILE, says how to resume, and the
// same command then finishes with a file byte-identical to an
// uninterrupted conversion.
func TestGGUFConvertSIGINT(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	// ~150 MB: long enough (one worker) that the signal lands mid-write.
	if _, err := (testmodel.Qwen3Options{Common: testmodel.Common{
		HiddenSize: 1024, IntermediateSize: 4096, NumLayers: 4, NumHeads: 8, NumKVHeads: 4, HeadDim: 128,
		VocabSize: 4096, MaxShardSize: 32 << 20, RepeatBlock: 1 << 12,
	}}).Write(src); err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join(dir, "ref.gguf")
	r := execFerry(t, nil, "gguf", "convert", "--json", "--jobs", "1", "--out", ref, src)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var refRes ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &refRes); err != nil {
		t.Fatal(err)
	}
	// Compared by digest: a 150 MB file read into this process would raise
	// its peak RSS, which later child processes report as theirs (Linux
	// keeps the pre-exec high-water mark of a vfork'd child).
	want := fileDigest(t, ref)
	out := filepath.Join(dir, "m.gguf")
	// Aim for a third of the write (the count resumed is logged, not
	// asserted: it depends on the machine's speed).
	stderr, code := sigintChild(t, func() bool { return exists(out + ".partial") }, func() bool { return exists(out) },
		func() { os.Remove(out) }, time.Duration(refRes.Seconds/3*float64(time.Second)), "gguf", "convert", "--jobs", "1", "--out", out, src)
	if code != exitInterrupted {
		t.Errorf("interrupted conversion exited %d, want %d: %s", code, exitInterrupted, stderr)
	}
	if !strings.Contains(stderr, "interrupted; ") || !strings.Contains(stderr, "run the same command again to resume") {
		t.Errorf("stderr does not say how to resume:\n%s", stderr)
	}
	checkInterrupted(t, stderr)
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("%s exists after the interrupt (%v)", out, err)
	}
	for _, p := range []string{out + ".partial", out + ".journal"} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("interrupted run left no %s: %v", p, err)
		}
	}
	if _, err := os.Stat(out + ".lock"); !os.IsNotExist(err) {
		t.Errorf("the interrupted run left its output lock (%v)", err)
	}
	r = execFerry(t, nil, "gguf", "convert", "--json", "--jobs", "1", "--out", out, src)
	if r.code != 0 {
		t.Fatalf("resume: exit %d: %s", r.code, r.stderr)
	}
	var res ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("interrupt: %s; resumed %d of %d tensors", strings.TrimSpace(stderr), res.Resumed, res.Tensors)
	if fileDigest(t, out) != want {
		t.Error("resumed output differs from an uninterrupted conversion")
	}
}

// fileDigest is the sha256 of the file at p, streamed.
func fileDigest(t *testing.T, p string) hashing.Digest {
	t.Helper()
	d, _, err := hashing.File(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// pokeTensor overwrites elements of a tensor of the checkpoint directory
// or safetensors file at path with the given values, in its dtype.
func pokeTensor(t *testing.T, path, name string, vals map[int64]float32) {
	t.Helper()
	var file string
	var off int64
	var info safetensors.TensorInfo
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		ck, err := safetensors.OpenDir(path)
		if err != nil {
			t.Fatal(err)
		}
		loc, ok := ck.Lookup(name)
		ck.Close()
		if !ok {
			t.Fatalf("%s: no tensor %s", path, name)
		}
		file, off, info = loc.Shard.Path, loc.Shard.DataOffset(), loc.Info
	} else {
		f, err := safetensors.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		info, ok = f.Tensor(name)
		f.Close()
		if !ok {
			t.Fatalf("%s: no tensor %s", path, name)
		}
		file, off = path, f.DataOffset()
	}
	fh, err := os.OpenFile(file, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	es := int64(info.DType.Bits() / 8)
	for i, v := range vals {
		b := make([]byte, es)
		if err := tensor.FromF32(info.DType, b, []float32{v}); err != nil {
			t.Fatal(err)
		}
		if _, err := fh.WriteAt(b, off+info.Begin+i*es); err != nil {
			t.Fatal(err)
		}
	}
}

// NaN and Inf already in the checkpoint are converted as they are, with
// one warning line per tensor and the counts in --json: through the
// vector bf16 → f16 kernel (attn/ffn weights), a plain copy (bf16) and the
// float32 path (a norm, which gets +1).
func TestGGUFConvertNonFinite(t *testing.T) {
	src := filepath.Join(t.TempDir(), "base")
	copyDir(t, bundledBase, src)
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	pokeTensor(t, src, "model.layers.0.mlp.down_proj.weight", map[int64]float32{5: nan, 300: -inf, 7000: inf})
	pokeTensor(t, src, "model.layers.0.input_layernorm.weight", map[int64]float32{3: nan})
	for _, tc := range []struct{ outtype, down string }{{"f16", "blk.0.ffn_down.weight"}, {"bf16", "blk.0.ffn_down.weight"}, {"f32", ""}} {
		out := filepath.Join(t.TempDir(), "m.gguf")
		r := execFerry(t, nil, "gguf", "convert", "--json", "--outtype", tc.outtype, "--out", out, src)
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.outtype, r.code, r.stderr)
		}
		var res ggufConvertResult
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatal(err)
		}
		want := []nonFiniteCount{{"blk.0.attn_norm.weight", 1}, {"blk.0.ffn_down.weight", 3}}
		if len(res.NonFinite) != len(want) || res.NonFinite[0] != want[0] || res.NonFinite[1] != want[1] {
			t.Errorf("%s: nonfinite %+v, want %+v", tc.outtype, res.NonFinite, want)
		}
		for _, w := range []string{"tensor blk.0.ffn_down.weight: 3 NaN/Inf values", "tensor blk.0.attn_norm.weight: 1 NaN/Inf values"} {
			if strings.Count(r.stderr, w) != 1 {
				t.Errorf("%s: stderr does not say %q once:\n%s", tc.outtype, w, r.stderr)
			}
		}
		if tc.down == "" {
			continue
		}
		f, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		ti, _ := f.Tensor(tc.down)
		raw := make([]byte, ti.Size())
		if _, err := f.Section(ti).ReadAt(raw, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		// Element 5 of the source is element 5 of the GGUF (same layout).
		got := uint16(raw[10]) | uint16(raw[11])<<8
		if tc.outtype == "f16" && got != 0x7e00 || tc.outtype == "bf16" && got != 0x7fc0 {
			t.Errorf("%s: NaN converted to %#04x", tc.outtype, got)
		}
	}
}

// A tokenizer whose pre-tokenizer ferry cannot name: the family's name is
// written and the warning goes to stderr and into --json.
func TestGGUFConvertWarnsUnknownPre(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "m")
	if _, err := (testmodel.Qwen35Options{}).Write(dir); err != nil {
		t.Fatal(err)
	}
	tokPath := filepath.Join(dir, "tokenizer.json")
	b, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte(`"Isolated"`), []byte(`"Removed"`), 1)
	if err := os.WriteFile(tokPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "m.gguf")
	r := execFerry(t, nil, "gguf", "convert", "--json", "--out", out, dir)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var res ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "unknown pre-tokenizer Split(Removed)") || !strings.Contains(res.Warnings[0], `family default "qwen35"`) {
		t.Errorf("json warnings %q", res.Warnings)
	}
	if !strings.Contains(r.stderr, "gguf convert: warning: "+tokPath+": unknown pre-tokenizer") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// A conversion that fails for want of space leaves nothing: no partial
// file, no journal, no lock. The file-size limit (ulimit -f) fails the
// same step a full disk does, reserving FILE.partial, with EFBIG instead
// of ENOSPC; the journal is smaller than the limit, as it was on the full
// disk where a 71-byte journal was left beside nothing.
func TestGGUFConvertNoSpaceLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	noSpaceLeavesNothing(t, dir, "gguf", "convert", "--out", filepath.Join(dir, "m.gguf"), bundledBase)
}

// noSpaceLeavesNothing runs ferry with args under a 64 KiB file size
// limit, which fails a write as a full disk does, and checks that it exits
// 1 saying why and leaves nothing in dir.
func noSpaceLeavesNothing(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", `ulimit -f 64 && exec "$0" "$@"`, os.Args[0]}, args...)...)
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("%v over the size limit: %v (want exit 1): %s", args, err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "file too large") {
		t.Errorf("stderr does not say why: %s", stderr.String())
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("the failed run left %s", e.Name())
	}
}

// vlBase is the vision-language checkpoint of gguf/convert's golden test
// (the reference base's vision tensors; its PROVENANCE.md).
const (
	vlBase      = "../../gguf/convert/testdata/qwen35vl/base"
	vlMMProjSHA = "1ae17f7fb2f614b7a2cea8736b593356e2ef96560fc6dd0d710a3352d2bbcd72"
)

// `ferry gguf convert --mmproj`: the reference converter's file, named as
// it names it in a directory, said to be the vision tower in text and
// --json; a text-only checkpoint and a missing preprocessor_config.json
// are refused (exit 2) with what to do, nothing written.
func TestGGUFConvertMMProjCLI(t *testing.T) {
	dir := t.TempDir()
	r := execFerry(t, nil, "gguf", "convert", "--mmproj", "--json", "--out", dir, vlBase)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var res ggufConvertResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	out := filepath.Join(dir, "mmproj-Base-F16.gguf")
	if !res.MMProj || res.Architecture != "clip" || res.Tensors != 34 || res.Out != out || res.Bytes != 617472 {
		t.Errorf("result %+v", res)
	}
	if d := fileDigest(t, out).Hex(); d != vlMMProjSHA {
		t.Errorf("%s: %s, the converter's is %s", out, d, vlMMProjSHA)
	}
	r = execFerry(t, nil, "gguf", "convert", "--mmproj", "--out", filepath.Join(dir, "again.gguf"), vlBase)
	if r.code != 0 || !strings.Contains(r.stdout, "(clip) f16, 34 tensors") || !strings.Contains(r.stdout, "mmproj: the vision tower") {
		t.Errorf("text: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}

	// verify mtp recognises it: not applicable, exit 0 with --require;
	// inspect shows it as an mmproj.
	r = execFerry(t, nil, "verify", "mtp", "--require", out)
	if r.code != 0 || !strings.Contains(r.stdout, "not_applicable") || !strings.Contains(r.stdout, "not applicable: mmproj (vision tower)") {
		t.Errorf("verify mtp: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	r = execFerry(t, nil, "verify", "mtp", "--require", "--json", out)
	var sum verify.Summary
	if err := json.Unmarshal([]byte(r.stdout), &sum); r.code != 0 || err != nil || !sum.Pass || len(sum.Results) != 1 || sum.Results[0].Verdict != verify.NotApplicable {
		t.Errorf("verify mtp --json: exit %d, %v: %s", r.code, err, r.stdout)
	}
	r = execFerry(t, nil, "inspect", "--json", out)
	var rep inspect.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); r.code != 0 || err != nil || rep.Summary.MMProj == nil || rep.Summary.MMProj.Projector != "qwen3vl_merger" {
		t.Errorf("inspect --json: exit %d, %v: %s", r.code, err, r.stdout)
	}

	noPre := filepath.Join(t.TempDir(), "base")
	if err := os.CopyFS(noPre, os.DirFS(vlBase)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(noPre, "preprocessor_config.json")); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	for _, tt := range []struct {
		name, dir string
		msg       []string
	}{
		{"text-only", bundledBase, []string{bundledBase + " has no vision tower", "Qwen3_5ForCausalLM"}},
		{"no preprocessor_config.json", noPre, []string{"preprocessor_config.json", "KeyError: 'image_mean'"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := execFerry(t, nil, "gguf", "convert", "--mmproj", "--out", filepath.Join(empty, "m.gguf"), tt.dir)
			if r.code != 2 {
				t.Errorf("exit %d, want 2: %s", r.code, r.stderr)
			}
			for _, m := range tt.msg {
				if !strings.Contains(r.stderr, m) {
					t.Errorf("stderr %q should say %q", r.stderr, m)
				}
			}
			if ents, _ := os.ReadDir(empty); len(ents) != 0 {
				t.Errorf("wrote %v", ents)
			}
		})
	}
}
