//go:build !linux && !darwin

package fsutil

// bootIDOS is unknown here: BootID falls back to a value of the process.
func bootIDOS() string { return "" }
