package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

const (
	mergeRef     = "../../merge/testdata/reference/qwen3"
	qwen35Base   = "../../testdata/models/qwen35-tiny/base"
	qwen35DoRA   = "../../testdata/models/qwen35-tiny/adapter-dora"
	qwen3DoRA    = mergeRef + "/adapters/dora"
	qwen3RSLoRA  = mergeRef + "/adapters/rslora"
	qwen3BaseDir = mergeRef + "/base"
)

// ferryMerge runs the CLI in-process and returns stdout+stderr and the exit
// code main would use.
func ferryMerge(t *testing.T, args ...string) (string, int) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(append([]string{"ferry", "merge"}, args...))
	if err != nil {
		out.WriteString("\nerror: " + err.Error())
	}
	return out.String(), exitCode(err)
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(out, in)
		in.Close()
		out.Close()
	}
}

func TestMergeCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "merged")

	// Dry run: the plan, nothing written.
	s, code := ferryMerge(t, "--base", qwen35Base, "--adapter", qwen35DoRA, "--out", out, "--dry-run")
	if code != exitOK || !strings.Contains(s, "31 targeted modules") || !strings.Contains(s, "DoRA") || !strings.Contains(s, "rewrite model-00007-of-00007.safetensors") {
		t.Fatalf("dry run: exit %d\n%s", code, s)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("--dry-run created %s", out)
	}
	s, code = ferryMerge(t, "--base", qwen3BaseDir, "--adapter", qwen3RSLoRA, "--dry-run", "--json")
	var plan struct {
		RSLoRA  bool `json:"rslora"`
		Modules []struct {
			Rank    int     `json:"rank"`
			Scaling float64 `json:"scaling"`
		} `json:"modules"`
	}
	if code != exitOK || json.Unmarshal([]byte(s), &plan) != nil || !plan.RSLoRA || len(plan.Modules) != 6 || plan.Modules[0].Scaling != 4 {
		t.Fatalf("dry run --json: exit %d\n%s", code, s)
	}

	// The merge: 71 tensors, MTP kept.
	s, code = ferryMerge(t, "--base", qwen35Base, "--adapter", qwen35DoRA, "--out", out, "--jobs", "2")
	if code != exitOK || !strings.Contains(s, "merged 31 modules") {
		t.Fatalf("merge: exit %d\n%s", code, s)
	}
	c, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	mtp := 0
	for _, l := range c.Tensors() {
		if strings.HasPrefix(l.Info.Name, "mtp.") {
			mtp++
		}
	}
	n := len(c.Tensors())
	if c.Config == nil || c.Config.MTPLayers() != 1 {
		t.Errorf("merged config lost mtp_num_hidden_layers")
	}
	c.Close()
	if n != 71 || mtp != 15 {
		t.Errorf("merged checkpoint has %d tensors (%d mtp.*), want 71 (15)", n, mtp)
	}

	// ferry inspect sees the MTP head in the merged checkpoint.
	app := newApp()
	var ins bytes.Buffer
	app.Writer, app.ErrWriter = &ins, &ins
	if err := app.Run([]string{"ferry", "inspect", "--json", out}); err != nil {
		t.Fatalf("inspect: %v\n%s", err, ins.String())
	}
	if !regexp.MustCompile(`"mtp":\s*\{\s*"present":\s*true,\s*"tensors":\s*15`).MatchString(ins.String()) {
		t.Errorf("ferry inspect does not show the 15-tensor MTP head:\n%.2000s", ins.String())
	}

	// A finished output holds only the checkpoint's files (no journal, no
	// temp files), so a re-run into it is refused like any non-empty
	// directory, naming why, and changes nothing.
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("finished output holds %s", e.Name())
		}
	}
	if s, code := ferryMerge(t, "--base", qwen35Base, "--adapter", qwen35DoRA, "--out", out); code != exitBadInput || !strings.Contains(s, "a finished merge keeps none") {
		t.Errorf("re-run into the finished output: exit %d\n%s", code, s)
	}

	// --json into another directory: every shard written.
	// (stdout alone: the plan's warnings go to stderr.)
	app = newApp()
	var stdout, stderr bytes.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	err = app.Run([]string{"ferry", "merge", "--base", qwen35Base, "--adapter", qwen35DoRA, "--out", filepath.Join(dir, "again"), "--json"})
	var res struct {
		Resumed  []string `json:"resumed"`
		Written  []string `json:"written"`
		Warnings []string `json:"warnings"`
	}
	if err != nil || json.Unmarshal(stdout.Bytes(), &res) != nil || len(res.Resumed) != 0 || len(res.Written) != 7 {
		t.Fatalf("--json run: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	// The adapter has no weights for the MTP layer its config targets:
	// said on stderr and in the JSON.
	if len(res.Warnings) != 1 || !strings.Contains(stderr.String(), "warning: config targets 7 MTP-head modules (mtp.layers.0.") {
		t.Errorf("MTP warnings: %d in --json, stderr:\n%s", len(res.Warnings), stderr.String())
	}
}

// TestMergeCLIBadInput: exit 2, a message naming the problem, and no output
// directory at all.
func TestMergeCLIBadInput(t *testing.T) {
	dir := t.TempDir()
	pickle := filepath.Join(dir, "pickle")
	os.MkdirAll(pickle, 0o755)
	cfg, _ := os.ReadFile(filepath.Join(qwen3DoRA, "adapter_config.json"))
	os.WriteFile(filepath.Join(pickle, "adapter_config.json"), cfg, 0o644)
	os.WriteFile(filepath.Join(pickle, "adapter_model.bin"), []byte("\x80\x02}q\x00."), 0o644)

	corrupt := filepath.Join(dir, "corrupt")
	copyDir(t, qwen3DoRA, corrupt)
	w := filepath.Join(corrupt, "adapter_model.safetensors")
	st, _ := os.Stat(w)
	os.Truncate(w, st.Size()/2)

	noMag := filepath.Join(dir, "nomag")
	copyDir(t, qwen3DoRA, noMag)
	stripMagnitudes(t, filepath.Join(qwen3DoRA, "adapter_model.safetensors"), filepath.Join(noMag, "adapter_model.safetensors"))

	cases := []struct {
		name    string
		args    []string
		mention string
	}{
		{"another-model", []string{"--base", qwen35Base, "--adapter", qwen3DoRA}, "would be ignored"},
		{"missing-magnitudes", []string{"--base", qwen3BaseDir, "--adapter", noMag}, "lora_magnitude_vector"},
		{"pickle-only", []string{"--base", qwen3BaseDir, "--adapter", pickle}, "pickle"},
		{"corrupt-adapter", []string{"--base", qwen3BaseDir, "--adapter", corrupt}, "adapter_model.safetensors"},
		{"no-adapter", []string{"--base", qwen3BaseDir, "--adapter", dir}, "adapter_config.json"},
		{"bad-dtype", []string{"--base", qwen3BaseDir, "--adapter", qwen3DoRA, "--dtype", "q4"}, "--dtype"},
		{"missing-flag", []string{"--adapter", qwen3DoRA}, "base"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+tc.name)
			s, code := ferryMerge(t, append(tc.args, "--out", out)...)
			if code != exitBadInput {
				t.Errorf("exit %d, want %d\n%s", code, exitBadInput, s)
			}
			if !strings.Contains(s, tc.mention) {
				t.Errorf("message does not mention %q:\n%s", tc.mention, s)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("an output directory was created")
			}
		})
	}
}

// stripMagnitudes copies an adapter file without its DoRA magnitudes.
func stripMagnitudes(t *testing.T, src, dst string) {
	t.Helper()
	f, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var specs []safetensors.TensorSpec
	var keep []safetensors.TensorInfo
	for _, ti := range f.Tensors {
		if strings.Contains(ti.Name, "magnitude") {
			continue
		}
		specs = append(specs, safetensors.TensorSpec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape})
		keep = append(keep, ti)
	}
	w, err := safetensors.Create(dst, f.Metadata, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range keep {
		if err := w.WriteTensor(ti.Name, f.Section(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMergeCLIAllowUnused: with --allow-unused the merge goes ahead and says
// which adapter tensors it ignored, on stderr and in --json.
func TestMergeCLIAllowUnused(t *testing.T) {
	dir := t.TempDir()
	ad := filepath.Join(dir, "adapter")
	copyDir(t, qwen3RSLoRA, ad)
	cfgPath := filepath.Join(ad, "adapter_config.json")
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["target_modules"] = []string{"q_proj", "down_proj"} // the v_proj factors become unused
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	out := filepath.Join(dir, "out")
	s, code := ferryMerge(t, "--base", qwen3BaseDir, "--adapter", ad, "--out", out)
	if code != exitBadInput || !strings.Contains(s, "--allow-unused") {
		t.Fatalf("without --allow-unused: exit %d\n%s", code, s)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("refused merge created %s", out)
	}

	app := newApp()
	var stdout, stderr bytes.Buffer
	app.Writer, app.ErrWriter = &stdout, &stderr
	if err := app.Run([]string{"ferry", "merge", "--base", qwen3BaseDir, "--adapter", ad, "--out", out, "--allow-unused", "--json"}); err != nil {
		t.Fatalf("--allow-unused: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "ignoring 4 adapter tensors") || !strings.Contains(stderr.String(), "layers.0.self_attn.v_proj.lora_A.weight") {
		t.Errorf("stderr does not list the ignored tensors:\n%s", stderr.String())
	}
	var res struct {
		Modules int      `json:"modules"`
		Unused  []string `json:"unused"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout.String())
	}
	if res.Modules != 4 || len(res.Unused) != 4 {
		t.Errorf("--json says %d modules and %d unused tensors, want 4 and 4", res.Modules, len(res.Unused))
	}
}

// `ferry merge --help` shows the flags a merge needs in USAGE.
func TestMergeHelpUsage(t *testing.T) {
	s, code := ferryMerge(t, "--help")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, s)
	}
	usage, _, _ := strings.Cut(s[strings.Index(s, "USAGE:"):], "DESCRIPTION:")
	for _, want := range []string{"--base DIR", "--adapter DIR", "--out DIR", "--dry-run"} {
		if !strings.Contains(usage, want) {
			t.Errorf("USAGE lacks %s:\n%s", want, usage)
		}
	}
}

// A real Ctrl-C: SIGINT to `ferry merge` mid-merge says it was interrupted
// and how to resume (exit 130, not "context canceled", exit 1), leaves no
// index, and the same command then ends with the files of an uninterrupted
// merge.
func TestMergeSIGINT(t *testing.T) {
	dir := t.TempDir()
	base, adapter := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	// ~150 MB, every linear adapted: long enough (one worker) that the
	// signal lands mid-merge.
	if _, err := (testmodel.Qwen3Options{Common: testmodel.Common{
		HiddenSize: 1024, IntermediateSize: 4096, NumLayers: 4, NumHeads: 8, NumKVHeads: 4, HeadDim: 128,
		VocabSize: 4096, MaxShardSize: 32 << 20, RepeatBlock: 1 << 12,
	}}).Write(base); err != nil {
		t.Fatal(err)
	}
	if _, err := (testmodel.AdapterOptions{AllLinear: true, DoRA: true}).WriteForDir(adapter, base); err != nil {
		t.Fatal(err)
	}
	type result struct {
		Files   []struct{ Name, SHA256 string }
		Seconds float64
	}
	mergeJSON := func(out string) result {
		t.Helper()
		r := execFerry(t, nil, "merge", "--json", "--jobs", "1", "--base", base, "--adapter", adapter, "--out", out)
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		var res result
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	ref := mergeJSON(filepath.Join(dir, "ref"))
	out := filepath.Join(dir, "merged")
	index := filepath.Join(out, safetensors.IndexName)
	stderr, code := sigintChild(t, func() bool { return exists(filepath.Join(out, "config.json")) }, func() bool { return exists(index) },
		func() { os.RemoveAll(out) }, time.Duration(ref.Seconds/3*float64(time.Second)), "merge", "--jobs", "1", "--base", base, "--adapter", adapter, "--out", out)
	if code != exitInterrupted {
		t.Errorf("interrupted merge exited %d, want %d: %s", code, exitInterrupted, stderr)
	}
	if !strings.Contains(stderr, "interrupted; ") || !strings.Contains(stderr, "run the same command again to resume") {
		t.Errorf("stderr does not say how to resume:\n%s", stderr)
	}
	checkInterrupted(t, stderr)
	got := mergeJSON(out)
	if len(got.Files) != len(ref.Files) {
		t.Fatalf("resumed merge wrote %d files, want %d", len(got.Files), len(ref.Files))
	}
	for i := range ref.Files {
		if got.Files[i] != ref.Files[i] {
			t.Errorf("resumed %s differs from an uninterrupted merge", got.Files[i].Name)
		}
	}
}

// NaN in lora_B: refused with the tensor and row, exit 2, nothing written;
// --allow-nonfinite merges. NaN/Inf in the base: merged as they are, one
// warning line per tensor, counts in --json.
func TestMergeCLINonFinite(t *testing.T) {
	dir := t.TempDir()
	base, adapter := filepath.Join(dir, "base"), filepath.Join(dir, "adapter")
	copyDir(t, qwen3BaseDir, base)
	copyDir(t, qwen3RSLoRA, adapter)
	const q = "model.layers.1.self_attn.q_proj"
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	pokeTensor(t, filepath.Join(adapter, "adapter_model.safetensors"), "base_model.model."+q+".lora_B.weight", map[int64]float32{5*4 + 2: nan})
	out := filepath.Join(dir, "out")
	s, code := ferryMerge(t, "--base", qwen3BaseDir, "--adapter", adapter, "--out", out)
	if code != exitBadInput || !strings.Contains(s, q+".lora_B.weight") || !strings.Contains(s, "row 5, column 2") || !strings.Contains(s, "--allow-nonfinite") {
		t.Fatalf("NaN in lora_B: exit %d\n%s", code, s)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("refused merge created %s (%v)", out, err)
	}
	if s, code := ferryMerge(t, "--base", qwen3BaseDir, "--adapter", adapter, "--out", out, "--allow-nonfinite"); code != exitOK {
		t.Fatalf("--allow-nonfinite: exit %d\n%s", code, s)
	}

	pokeTensor(t, base, q+".weight", map[int64]float32{3: nan, 700: -inf, 701: inf})
	s, code = ferryMerge(t, "--base", base, "--adapter", qwen3RSLoRA, "--out", filepath.Join(dir, "out2"), "--json")
	if code != exitOK {
		t.Fatalf("NaN in the base: exit %d\n%s", code, s)
	}
	if w := "merge: warning: tensor " + q + ".weight: 3 NaN/Inf values"; strings.Count(s, w) != 1 {
		t.Errorf("want one line %q:\n%s", w, s)
	}
	var res struct {
		NonFinite []nonFiniteCount `json:"nonfinite"`
	}
	if err := json.Unmarshal([]byte(s[strings.Index(s, "{"):]), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.NonFinite) != 1 || res.NonFinite[0] != (nonFiniteCount{q + ".weight", 3}) {
		t.Errorf("--json nonfinite %+v", res.NonFinite)
	}
}
