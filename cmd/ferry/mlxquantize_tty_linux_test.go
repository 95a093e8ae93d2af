package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-llm/ferry/internal/ptytest"
)

// With stderr on a terminal, mlx quantize draws a byte progress bar there;
// stdout carries only the result.
func TestMLXQuantizeProgressOnTTY(t *testing.T) {
	out := filepath.Join(t.TempDir(), "mlx")
	cmd := exec.Command(os.Args[0], "mlx", "quantize", bundledBase, "--out", out, "--bits", "4", "-j", "1")
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	tty, err := ptytest.Run(t, cmd)
	if err != nil {
		t.Fatalf("mlx quantize: %v; terminal: %q", err, tty)
	}
	if !strings.Contains(tty, "converting") {
		t.Errorf("no progress bar on the terminal: %q", tty)
	}
	if !strings.HasPrefix(stdout.String(), "/") || !strings.Contains(stdout.String(), "model_type qwen3_5") {
		t.Errorf("stdout is not the result: %q", stdout.String())
	}
}
