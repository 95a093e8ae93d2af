//go:build !unix

package sshconn

import "os"

// lockFile cannot lock on this platform; appends are still one write each.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) {}
