package ptytest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Open opens a pseudo-terminal pair through Linux /dev/ptmx. A machine
// without one fails the test rather than skipping it: CI has /dev/ptmx, and
// a skipped TTY check must not read as a pass.
func Open(t testing.TB) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// Run runs cmd with its stderr on a new pseudo-terminal (the caller sets
// cmd.Stdout and cmd.Env) and returns what the terminal showed and the
// error cmd.Wait gave.
func Run(t testing.TB, cmd *exec.Cmd) (string, error) {
	t.Helper()
	master, slave := Open(t)
	defer master.Close()
	cmd.Stderr = slave
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
	werr := cmd.Wait()
	if err := <-done; err != nil && !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	return tty.String(), werr
}
