package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/gguf"
	"github.com/ferry-llm/ferry/internal/testmodel"
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
	if res.Architecture != "qwen35" || res.Tensors != 71 || res.MTPLayers != 1 || res.Out != out {
		t.Errorf("result %+v", res)
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
	var rep ggufInspectReport
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
