package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-llm/ferry/internal/ptytest"
)

// With stderr on a terminal, mlx quantize draws a byte progress bar there;
// stdout carries only the result.
func TestMLXQuantizeProgressOnTTY(t *testing.T) {
	master, slave := ptytest.Open(t)
	defer master.Close()
	out := filepath.Join(t.TempDir(), "mlx")
	cmd := exec.Command(os.Args[0], "mlx", "quantize", bundledBase, "--out", out, "--bits", "4", "-j", "1")
	cmd.Env = append(os.Environ(), "FERRY_INSPECT_TEST_AS_MAIN=1")
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	var tty bytes.Buffer
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(&tty, master) // ends with EIO once the child's side closes
		done <- err
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("mlx quantize: %v; terminal: %q", err, tty.String())
	}
	if err := <-done; err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	if !strings.Contains(tty.String(), "converting") {
		t.Errorf("no progress bar on the terminal: %q", tty.String())
	}
	if !strings.HasPrefix(stdout.String(), "/") || !strings.Contains(stdout.String(), "model_type qwen3_5") {
		t.Errorf("stdout is not the result: %q", stdout.String())
	}
}
