package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/manifest"
	"github.com/ferry-llm/ferry/verify"
)

const (
	// The qwen35 reference base with its mtp.* head (testdata/models).
	bundledQwen35 = "../../testdata/models/qwen35-tiny/base"
	// The reference qwen35 Q4_K_M GGUF, with blk.4.nextn.* (see
	// verify/testdata/reference/PROVENANCE.md).
	refQ4KM = "../../verify/testdata/reference/gguf/qwen35-base-Q4_K_M.gguf"
)

func genModel(t *testing.T, w interface {
	Write(string) (*testmodel.Model, error)
}) string {
	t.Helper()
	m, err := w.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return m.Dir
}

type verifyJSON struct {
	Pass    bool `json:"pass"`
	Require bool `json:"require"`
	Results []struct {
		Path    string   `json:"path"`
		Pass    bool     `json:"pass"`
		Verdict string   `json:"verdict"`
		Format  string   `json:"format"`
		Missing []string `json:"missing"`
		Message string   `json:"message"`
		Reason  string   `json:"reason"`
		Error   string   `json:"error"`
	} `json:"results"`
}

func TestVerifyMTPCLI(t *testing.T) {
	dropped := genModel(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}})
	absent := genModel(t, testmodel.Qwen3Options{})
	notModel := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notModel, []byte("hello"), 0o644)
	runCLICases(t, []cliCase{
		{"ok: safetensors and gguf", []string{"verify", "mtp", bundledQwen35, refQ4KM}, exitOK,
			[]string{"PATH", "VERDICT", "safetensors  qwen-mtp", "gguf         gguf-nextn", "15/15", "ok"}},
		// The head's count is inspect's ("present: 15 tensors in nextn
		// layers [4]"): blk.4's shared_head_norm, optional for llama.cpp,
		// is one of them (verify said 14/14).
		{"gguf: every head tensor counted, as inspect counts", []string{"verify", "mtp", refQ4KM}, exitOK, []string{"15/15", "ok"}},
		{"dropped", []string{"verify", "mtp", dropped}, exitVerify,
			[]string{"dropped", "ferry merge", "missing (15): mtp.fc.weight"}},
		{"absent", []string{"verify", "mtp", absent}, exitOK, []string{"absent"}},
		{"absent with --require", []string{"verify", "mtp", "--require", absent}, exitVerify, []string{"absent (required)"}},
		{"ok and dropped", []string{"verify", "mtp", bundledQwen35, dropped}, exitVerify, []string{"ok", "dropped"}},
		{"deep", []string{"verify", "mtp", "--deep", refQ4KM}, exitOK,
			[]string{"deep: read", "blk.4.nextn.eh_proj.weight Q4_K [512 256]: every super-block's d and dmin finite, not all zero"}},
		{"not a model", []string{"verify", "mtp", notModel}, exitBadInput, []string{"not a model"}},
		{"bad input beside a good one", []string{"verify", "mtp", bundledQwen35, notModel}, exitBadInput, []string{"ok", "error"}},
		{"no path", []string{"verify", "mtp"}, exitBadInput, nil},
		{"unknown flag", []string{"verify", "mtp", "--frobnicate", bundledQwen35}, exitBadInput, nil},
		{"verify without a check", []string{"verify"}, exitBadInput, nil},
		{"whole-artifact verify is not built", []string{"verify", bundledQwen35}, exitFailure, nil},
	})
}

func TestVerifyMTPJSON(t *testing.T) {
	dropped := genModel(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}})
	absent := genModel(t, testmodel.DeepSeekV3Options{NoNextN: true})
	for _, c := range []struct {
		args     []string
		code     int
		pass     bool
		verdicts []string
	}{
		{[]string{bundledQwen35, refQ4KM, absent}, exitOK, true, []string{"ok", "ok", "absent"}},
		{[]string{"--require", bundledQwen35, absent}, exitVerify, false, []string{"ok", "absent"}},
		{[]string{dropped}, exitVerify, false, []string{"dropped"}},
	} {
		out, code, err := runFerry(t, append([]string{"verify", "mtp", "--json"}, c.args...)...)
		if code != c.code {
			t.Fatalf("%v: exit %d (%v), want %d\n%s", c.args, code, err, c.code, out)
		}
		var got verifyJSON
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		if got.Pass != c.pass || len(got.Results) != len(c.verdicts) {
			t.Fatalf("%v: %+v", c.args, got)
		}
		for i, v := range c.verdicts {
			if got.Results[i].Verdict != v {
				t.Errorf("%v: result %d verdict %q, want %q", c.args, i, got.Results[i].Verdict, v)
			}
		}
		if c.verdicts[0] == "dropped" && (len(got.Results[0].Missing) != 15 || !strings.Contains(got.Results[0].Message, "ferry merge") ||
			got.Results[0].Reason != "dropped: "+got.Results[0].Message) {
			t.Errorf("dropped: %+v", got.Results[0])
		}
	}
	// A path that cannot be checked appears in the JSON with its error.
	out, code, _ := runFerry(t, "verify", "mtp", "--json", bundledQwen35, filepath.Join(t.TempDir(), "missing"))
	var got verifyJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitBadInput {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	if got.Pass || got.Results[1].Error == "" || got.Results[1].Reason != got.Results[1].Error || got.Results[0].Verdict != "ok" || got.Results[0].Reason != "" {
		t.Errorf("%+v", got)
	}
}

// `ferry verify mtp --json` and the pipeline's verify_mtp stage
// (mtp-report.json) report the same check of the same GGUF in one layout,
// verify.Summary: the same keys at every level, and the same values but
// the artifact's name (the CLI's PATH, the stage's "<stage>/<file>").
func TestVerifyMTPReportsAgree(t *testing.T) {
	dir := t.TempDir()
	gguf := filepath.Join(dir, "m.gguf")
	b, err := os.ReadFile(refQ4KM)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gguf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "p.yaml")
	os.WriteFile(p, []byte("name: v\nstages:\n  - name: base\n    import: { path: m.gguf }\n"+
		"  - name: check\n    verify_mtp: { from: base, require: true, deep: true }\n"), 0o644)
	if out, code, err := runFerry(t, "pipeline", "run", p); code != exitOK {
		t.Fatalf("pipeline run: exit %d: %v\n%s", code, err, out)
	}
	s, err := manifest.Load(filepath.Join(dir, ".ferry"))
	if err != nil {
		t.Fatal(err)
	}
	rec := s.StageRecord("v", "check")
	if rec == nil || len(rec.Outputs) != 1 || rec.Outputs[0].Path != "mtp-report.json" {
		t.Fatalf("verify_mtp record: %+v", rec)
	}
	stored, err := os.ReadFile(s.BlobPath(rec.Outputs[0].Digest))
	if err != nil {
		t.Fatal(err)
	}
	printed, code, err := runFerry(t, "verify", "mtp", "--json", "--require", "--deep", gguf)
	if code != exitOK {
		t.Fatalf("verify mtp: exit %d: %v\n%s", code, err, printed)
	}

	var cliAny, stageAny any
	if err := json.Unmarshal([]byte(printed), &cliAny); err != nil {
		t.Fatalf("CLI: %v\n%s", err, printed)
	}
	if err := json.Unmarshal(stored, &stageAny); err != nil {
		t.Fatalf("mtp-report.json: %v\n%s", err, stored)
	}
	if c, s := jsonShape(cliAny), jsonShape(stageAny); c != s {
		t.Errorf("layouts differ:\nCLI:   %s\nstage: %s", c, s)
	}
	var cli, stage verify.Summary
	json.Unmarshal([]byte(printed), &cli)
	json.Unmarshal(stored, &stage)
	if len(cli.Results) != 1 || len(stage.Results) != 1 {
		t.Fatalf("results: CLI %d, stage %d, want 1 each", len(cli.Results), len(stage.Results))
	}
	if cli.Results[0].Path != gguf || stage.Results[0].Path != "base/m.gguf" {
		t.Errorf("paths %q and %q, want %q and %q", cli.Results[0].Path, stage.Results[0].Path, gguf, "base/m.gguf")
	}
	cli.Results[0].Path, stage.Results[0].Path = "", ""
	if !reflect.DeepEqual(cli, stage) {
		t.Errorf("the reports differ:\nCLI:   %+v\nstage: %+v", cli, stage)
	}
	if !cli.Pass || !cli.Require || !cli.Deep || cli.Results[0].Report == nil || cli.Results[0].Verdict != verify.OK || cli.Results[0].BytesRead == 0 {
		t.Errorf("CLI report: %+v", cli)
	}
}

// jsonShape renders the keys of a decoded JSON value at every level (object
// keys sorted, arrays by their first element), without the values.
func jsonShape(v any) string {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + jsonShape(v[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		if len(v) == 0 {
			return "[]"
		}
		return "[" + jsonShape(v[0]) + "]"
	default:
		return fmt.Sprintf("%T", v)
	}
}
