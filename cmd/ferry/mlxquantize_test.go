package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/mlxpack"
)

type mlxQuantizeJSON struct {
	ModelType    string         `json:"model_type"`
	Quantization map[string]any `json:"quantization"`
	MTPDropped   int            `json:"mtp_dropped"`
	MTPKept      int            `json:"mtp_kept"`
	Files        []string       `json:"files"`
	Tensors      []struct {
		Name      string   `json:"name"`
		Module    string   `json:"module"`
		Bits      int      `json:"bits"`
		GroupSize int      `json:"group_size"`
		Bytes     int64    `json:"bytes"`
		RMSE      *float64 `json:"rmse"`
		MaxAbsErr *float64 `json:"max_abs_err"`
	} `json:"tensors"`
}

func verifyMTP(t *testing.T, dir string) (verdict, message string, code int) {
	t.Helper()
	out, code, _ := runFerry(t, "verify", "mtp", "--json", dir)
	var v verifyJSON
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Results) != 1 {
		t.Fatalf("verify mtp --json: %v\n%s", err, out)
	}
	return v.Results[0].Verdict, v.Results[0].Message, code
}

// `ferry mlx quantize` on the bundled Qwen3.5: the --json summary lists
// every tensor with its module, bits, group size, bytes and quantization
// error; the MTP head is dropped and recorded, so `ferry verify mtp` says
// absent and why (and fails with --require); --keep-mtp keeps it and
// verify says ok; the same output without the record (what mlx_lm.convert
// writes: the count kept, no head) is "dropped".
func TestMLXQuantizeCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "mlx4")
	stdout, code, err := runFerry(t, "mlx", "quantize", bundledBase, "--out", out, "--bits", "4", "--json", "-j", "2")
	if code != exitOK {
		t.Fatalf("exit %d: %v\n%s", code, err, stdout)
	}
	i := strings.Index(stdout, "{")
	if i < 0 {
		t.Fatalf("no JSON in %q", stdout)
	}
	if !strings.Contains(stdout[:i], "MTP head dropped (15 mtp.* tensors)") {
		t.Errorf("no MTP drop line before the result: %q", stdout[:i])
	}
	var res mlxQuantizeJSON
	if err := json.Unmarshal([]byte(stdout[i:]), &res); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if res.ModelType != "qwen3_5" || res.MTPDropped != 15 || res.MTPKept != 0 || len(res.Tensors) != 56 {
		t.Errorf("result: model_type %s, mtp dropped %d kept %d, %d tensors", res.ModelType, res.MTPDropped, res.MTPKept, len(res.Tensors))
	}
	quantized := 0
	for _, tr := range res.Tensors {
		if tr.Bits == 0 {
			if tr.RMSE != nil {
				t.Errorf("%s: float, but an error figure", tr.Name)
			}
			continue
		}
		quantized++
		if tr.Bits != 4 || tr.GroupSize != 64 || tr.Bytes <= 0 || tr.RMSE == nil || *tr.RMSE <= 0 || tr.MaxAbsErr == nil || *tr.MaxAbsErr < *tr.RMSE {
			t.Errorf("%s: %+v", tr.Name, tr)
		}
	}
	if quantized != 33 { // the reference conversion's 33 .scales tensors
		t.Errorf("%d quantized modules, want 33", quantized)
	}

	verdict, msg, code := verifyMTP(t, out)
	if verdict != "absent" || code != exitOK || !strings.Contains(msg, "left out on purpose") || !strings.Contains(msg, "--keep-mtp") {
		t.Errorf("verify mtp: %s (exit %d): %s", verdict, code, msg)
	}
	if _, code, _ := runFerry(t, "verify", "mtp", "--require", out); code != exitVerify {
		t.Errorf("verify mtp --require on a dropped head: exit %d, want %d", code, exitVerify)
	}

	// What mlx_lm.convert writes: the head dropped, the config still
	// promising it, no record.
	asMLXLM := filepath.Join(dir, "mlxlm")
	if err := os.CopyFS(asMLXLM, os.DirFS(out)); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(asMLXLM, "config.json"))
	json.Unmarshal(b, &cfg)
	delete(cfg, mlxpack.MTPRecordKey)
	cfg["mtp_num_hidden_layers"] = 1
	b, _ = json.Marshal(cfg)
	os.Chmod(filepath.Join(asMLXLM, "config.json"), 0o644)
	if err := os.WriteFile(filepath.Join(asMLXLM, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if verdict, msg, _ := verifyMTP(t, asMLXLM); verdict != "dropped" {
		t.Errorf("mlx_lm.convert-style output: %s: %s", verdict, msg)
	}

	kept := filepath.Join(dir, "mlx4-mtp")
	if _, code, err := runFerry(t, "mlx", "quantize", bundledBase, "--out", kept, "--bits", "4", "--keep-mtp"); code != exitOK {
		t.Fatalf("--keep-mtp: exit %d: %v", code, err)
	}
	if verdict, msg, code := verifyMTP(t, kept); verdict != "ok" || code != exitOK {
		t.Errorf("verify mtp after --keep-mtp: %s (exit %d): %s", verdict, code, msg)
	}
	// The head sits in mtp.safetensors, where no released mlx-lm looks:
	// model.safetensors is the one without the head, and verify has no
	// double-shift warning for ferry's own output.
	if text, _, _ := runFerry(t, "verify", "mtp", kept); strings.Contains(text, "WARNING") || !strings.Contains(text, " ok") {
		t.Errorf("verify mtp after --keep-mtp:\n%s", text)
	}
	withHead, _ := os.ReadFile(filepath.Join(kept, "model.safetensors"))
	noHead, _ := os.ReadFile(filepath.Join(out, "model.safetensors"))
	if len(withHead) == 0 || !bytes.Equal(withHead, noHead) {
		t.Error("--keep-mtp: model.safetensors differs from the conversion without the head")
	}
	if _, err := os.Stat(filepath.Join(kept, "mtp.safetensors")); err != nil {
		t.Error(err)
	}
}

func TestMLXQuantizeCLIErrors(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists")
	os.Mkdir(exists, 0o755)
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no SRC", []string{"mlx", "quantize", "--out", filepath.Join(dir, "a")}, exitBadInput, "SRC"},
		{"no --out", []string{"mlx", "quantize", bundledBase}, exitBadInput, "--out"},
		{"two sources", []string{"mlx", "quantize", bundledBase, "--src", bundledBase, "--out", filepath.Join(dir, "b")}, exitBadInput, "not both"},
		{"bits", []string{"mlx", "quantize", bundledBase, "--out", filepath.Join(dir, "c"), "--bits", "7"}, exitBadInput, "7"},
		{"group size", []string{"mlx", "quantize", bundledBase, "--out", filepath.Join(dir, "d"), "--bits", "4", "--group-size", "16"}, exitBadInput, "16"},
		{"module-bits", []string{"mlx", "quantize", bundledBase, "--out", filepath.Join(dir, "e"), "--bits", "4", "--module-bits", "lm_head"}, exitBadInput, "REGEX=BITS"},
		{"output exists", []string{"mlx", "quantize", bundledBase, "--out", exists}, exitBadInput, "exists"},
		{"output inside the source", []string{"mlx", "quantize", bundledBase, "--out", filepath.Join(bundledBase, "mlx")}, exitBadInput, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, code, err := runFerry(t, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %v\n%s", code, tc.code, err, out)
			}
			if err == nil || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("error %v does not say %q", err, tc.says)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(bundledBase, "mlx")); !errors.Is(err, os.ErrNotExist) {
		t.Error("wrote into the source")
	}
}

// `mlx repack` and `mlx quantize` take their arguments the same way:
// SRC --out DIR; the older --src/--dst form (and a mix) still works and
// gives the same directory; SRC twice is a usage error.
func TestMLXArgumentForms(t *testing.T) {
	qsrc := filepath.Join(t.TempDir(), "qwen3")
	if _, err := (testmodel.Qwen3Options{}).Write(qsrc); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd, src string
		extra    []string
	}{
		{"repack", mlxWriteFixture(t, testmodel.CompressedDeepSeekV3(1)), nil},
		{"quantize", qsrc, []string{"--bits", "4"}},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			dir := t.TempDir()
			forms := []struct {
				name string
				args []string
			}{
				{"positional", []string{tc.src, "--out", filepath.Join(dir, "a")}},
				{"old flags", []string{"--src", tc.src, "--dst", filepath.Join(dir, "b")}},
				{"mixed", []string{"--src", tc.src, "--out", filepath.Join(dir, "c")}},
				{"short", []string{tc.src, "-o", filepath.Join(dir, "d")}},
			}
			for _, f := range forms {
				args := append(append([]string{"mlx", tc.cmd}, f.args...), tc.extra...)
				if out, code, err := runFerry(t, args...); code != exitOK {
					t.Fatalf("%s: exit %d: %v\n%s", f.name, code, err, out)
				}
			}
			a, err := os.ReadFile(filepath.Join(dir, "a", "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{"b", "c", "d"} {
				if b, _ := os.ReadFile(filepath.Join(dir, d, "config.json")); string(a) != string(b) {
					t.Errorf("%s: config.json differs between argument forms", d)
				}
			}
			args := append([]string{"mlx", tc.cmd, tc.src, "--src", tc.src, "--out", filepath.Join(dir, "e")}, tc.extra...)
			if _, code, err := runFerry(t, args...); code != exitBadInput || err == nil || !strings.Contains(err.Error(), "mlx "+tc.cmd+": ") {
				t.Errorf("SRC and --src both: exit %d (%v), want %d naming mlx %s", code, err, exitBadInput, tc.cmd)
			}
			args = append([]string{"mlx", tc.cmd, tc.src, "--out", filepath.Join(dir, "f"), "--no-such-flag"}, tc.extra...)
			if _, code, err := runFerry(t, args...); code != exitBadInput || err == nil || !strings.Contains(err.Error(), "mlx "+tc.cmd+": ") {
				t.Errorf("unknown flag: exit %d (%v), want %d naming mlx %s", code, err, exitBadInput, tc.cmd)
			}
		})
	}
}
