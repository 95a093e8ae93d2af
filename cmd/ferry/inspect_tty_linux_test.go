package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-llm/ferry/internal/ptytest"
)

// With stderr on a terminal, --hash draws a byte progress bar there, and
// stdout still carries only the result.
func TestInspectHashProgressOnTTY(t *testing.T) {
	master, slave := ptytest.Open(t)
	defer master.Close()
	cmd := exec.Command(os.Args[0], "inspect", "--json", "--hash", "--jobs", "1", bundledBase)
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
		t.Fatalf("inspect: %v; terminal: %q", err, tty.String())
	}
	if err := <-done; err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	if !strings.Contains(tty.String(), "hashing") {
		t.Errorf("no progress bar on the terminal: %q", tty.String())
	}
	var rep inspectReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || len(rep.Tensors) != 71 {
		t.Errorf("stdout is not the JSON report: %v", err)
	}
}
