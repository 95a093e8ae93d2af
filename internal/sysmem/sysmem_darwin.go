package sysmem

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

func total() uint64 {
	n, err := unix.SysctlUint64("hw.memsize")
	if err != nil {
		return 0
	}
	return n
}

// PeakRSS is the peak resident set size, in bytes, of the finished process
// ps describes (macOS reports ru_maxrss in bytes); 0 when unknown.
func PeakRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss
	}
	return 0
}
