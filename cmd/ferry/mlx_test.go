package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/testmodel"
	"github.com/ferry-llm/ferry/safetensors"
)

// runFerry runs the CLI in-process and returns stdout and the exit code
// main would use.
func runFerry(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	app.ErrWriter = &out
	err := app.Run(interspersed(app, append([]string{"ferry"}, args...)))
	return out.String(), exitCode(err), err
}

func mlxWriteFixture(t *testing.T, c *testmodel.CompressedCheckpoint) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if err := c.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestMLXRepackCLI(t *testing.T) {
	src := mlxWriteFixture(t, testmodel.CompressedDeepSeekV3(1))
	dst := filepath.Join(t.TempDir(), "mlx")
	out, code, err := runFerry(t, "mlx", "repack", "--src", src, "--dst", dst)
	if code != exitOK {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	if !strings.Contains(out, "mode link") || !strings.Contains(out, "bits 4, group_size 32, mode affine") {
		t.Errorf("output:\n%s", out)
	}
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		if e.Name() == "config.json" {
			continue
		}
		a, err1 := os.Stat(filepath.Join(dst, e.Name()))
		b, err2 := os.Stat(filepath.Join(src, e.Name()))
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			t.Errorf("%s: not linked to the source", e.Name())
		}
	}

	// Re-run with --json: a no-op, reported as such.
	out, code, err = runFerry(t, "mlx", "repack", "--src", src, "--dst", dst, "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %v", code, err)
	}
	var res struct {
		Mode          string
		Changed       bool
		PackedModules int            `json:"packed_modules"`
		Quantization  map[string]any `json:"quantization"`
		Entries       []struct{ Name, Kind, Action string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Mode != "link" || res.Changed || res.PackedModules != 12 || len(res.Entries) != len(ents) {
		t.Errorf("json result %+v", res)
	}
	if !reflect.DeepEqual(res.Quantization, map[string]any{"bits": 4.0, "group_size": 32.0, "mode": "affine"}) {
		t.Errorf("quantization %v", res.Quantization)
	}
	for _, e := range res.Entries {
		if e.Action != "unchanged" {
			t.Errorf("%s: %s on re-run", e.Name, e.Action)
		}
	}
}

func TestMLXRepackCLIRewrite(t *testing.T) {
	src := mlxWriteFixture(t, testmodel.CompressedQwen3(2))
	dst := filepath.Join(t.TempDir(), "mlx")
	out, code, err := runFerry(t, "mlx", "repack", "--src", src, "--dst", dst)
	if code != exitBadInput || !strings.Contains(err.Error(), "--rewrite") {
		t.Fatalf("exit %d, err %v", code, err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Error("dst created")
	}
	out, code, err = runFerry(t, "mlx", "repack", "--src", src, "--dst", dst, "--rewrite", "--relative")
	if code != exitOK {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	if !strings.Contains(out, "mode rewrite") {
		t.Errorf("output:\n%s", out)
	}
	link, err := os.Readlink(filepath.Join(dst, "tokenizer.json"))
	if err != nil || filepath.IsAbs(link) {
		t.Errorf("tokenizer.json link %q, %v", link, err)
	}
}

func TestMLXRepackCLIRewriteMoE(t *testing.T) {
	src := mlxWriteFixture(t, testmodel.CompressedQwen3MoE(5))
	dst := filepath.Join(t.TempDir(), "mlx")
	if _, code, err := runFerry(t, "mlx", "repack", "--src", src, "--dst", dst); code != exitBadInput || err == nil || !strings.Contains(err.Error(), "--rewrite") {
		t.Fatalf("plain repack: exit %d, %v", code, err)
	}
	if _, code, err := runFerry(t, "mlx", "repack", "--src", src, "--dst", dst, "--rewrite"); code != 0 || err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	ck, err := safetensors.OpenDirOptions(dst, safetensors.DirOptions{FollowExternalLinks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range []string{"model.layers.1.mlp.switch_mlp.down_proj.weight", "model.layers.1.mlp.switch_mlp.down_proj.scales", "model.layers.1.mlp.switch_mlp.down_proj.biases"} {
		if l, ok := ck.Lookup(name); !ok || l.Info.Shape[0] != 4 {
			t.Errorf("%s: %v", name, ok)
		}
	}
}

func TestMLXRepackCLIErrors(t *testing.T) {
	good := mlxWriteFixture(t, testmodel.CompressedDeepSeekV3(3))
	asym := testmodel.CompressedDeepSeekV3(3)
	asym.QuantWeights("group_0")["symmetric"] = false
	asymDir := mlxWriteFixture(t, asym)
	moe := testmodel.CompressedQwen3(4)
	moe.Config["model_type"] = "qwen2_moe" // experts stacked only for qwen3_moe, qwen3_5_moe
	for _, tn := range moe.Tensors {
		tn.Name = strings.Replace(tn.Name, ".mlp.", ".mlp.experts.0.", 1)
	}
	moeDir := mlxWriteFixture(t, moe)
	existing := t.TempDir()
	os.WriteFile(filepath.Join(existing, "README.md"), []byte("keep"), 0o644)

	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"missing dst", []string{"mlx", "repack", "--src", good}, exitBadInput, "--out"},
		{"stray argument", []string{"mlx", "repack", good, "--dst", filepath.Join(t.TempDir(), "x"), "extra"}, exitBadInput, "one SRC"},
		{"SRC and --src", []string{"mlx", "repack", "--src", good, "--dst", filepath.Join(t.TempDir(), "x"), "extra"}, exitBadInput, "not both"},
		{"unknown flag", []string{"mlx", "repack", "--bogus"}, exitBadInput, "bogus"},
		{"no such source", []string{"mlx", "repack", "--src", filepath.Join(t.TempDir(), "nope"), "--dst", filepath.Join(t.TempDir(), "x")}, exitBadInput, "nope"},
		{"asymmetric", []string{"mlx", "repack", "--src", asymDir, "--dst", filepath.Join(t.TempDir(), "x")}, exitBadInput, "symmetric"},
		{"foreign files in dst", []string{"mlx", "repack", "--src", good, "--dst", existing}, exitBadInput, "README.md"},
		{"experts rewrite not built", []string{"mlx", "repack", "--src", moeDir, "--dst", filepath.Join(t.TempDir(), "x"), "--rewrite"}, exitFailure, "not built"},
		{"quantize a compressed-tensors checkpoint", []string{"mlx", "quantize", "--src", good, "--out", filepath.Join(t.TempDir(), "x")}, exitBadInput, "mlx repack"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, code, err := runFerry(t, tc.args...)
			if code != tc.code || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("exit %d (want %d), err %v (want mention of %q)", code, tc.code, err, tc.want)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(existing, "README.md")); string(b) != "keep" {
		t.Error("existing dst touched")
	}
	if ents, _ := os.ReadDir(existing); len(ents) != 1 {
		t.Errorf("existing dst now holds %d entries", len(ents))
	}
}
