package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
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
		Error   string   `json:"error"`
	} `json:"results"`
}

func TestVerifyMTPCLI(t *testing.T) {
	dropped := genModel(t, testmodel.Qwen35Options{Hybrid: testmodel.Hybrid{OmitMTPTensors: true}})
	absent := genModel(t, testmodel.Qwen3Options{})
	notModel := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notModel, []byte("hello"), 0o644)
	cases := []struct {
		name string
		args []string
		code int
		want []string // substrings of the output
	}{
		{"ok: safetensors and gguf", []string{"verify", "mtp", bundledQwen35, refQ4KM}, exitOK,
			[]string{"PATH", "VERDICT", "safetensors  qwen-mtp", "gguf         gguf-nextn", "15/15", "14/14", "ok"}},
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
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code, err := runFerry(t, c.args...)
			if code != c.code {
				t.Fatalf("exit %d (%v), want %d\n%s", code, err, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) && (err == nil || !strings.Contains(err.Error(), w)) {
					t.Errorf("output lacks %q:\n%s\nerr: %v", w, out, err)
				}
			}
		})
	}
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
		if c.verdicts[0] == "dropped" && (len(got.Results[0].Missing) != 15 || !strings.Contains(got.Results[0].Message, "ferry merge")) {
			t.Errorf("dropped: %+v", got.Results[0])
		}
	}
	// A path that cannot be checked appears in the JSON with its error.
	out, code, _ := runFerry(t, "verify", "mtp", "--json", bundledQwen35, filepath.Join(t.TempDir(), "missing"))
	var got verifyJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitBadInput {
		t.Fatalf("exit %d, %v\n%s", code, err, out)
	}
	if got.Pass || got.Results[1].Error == "" || got.Results[0].Verdict != "ok" {
		t.Errorf("%+v", got)
	}
}
