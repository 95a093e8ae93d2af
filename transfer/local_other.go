//go:build !linux

package transfer

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncFS makes the writes durable: sync(2), this platform having no
// syncfs.
func syncFS(string) error { return unix.Sync() }

// networkFS: this platform's re-reads are not told apart (see local.go).
func networkFS(string) bool { return false }

func dropCache(*os.File, int64, int64) {}

func startWriteback(*os.File, int64, int64) {}
