package sysmem

import (
	"os"
	"syscall"
)

func total() uint64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// PeakRSS is the peak resident set size, in bytes, of the finished process
// ps describes (Linux reports ru_maxrss in KiB); 0 when unknown.
func PeakRSS(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss << 10
	}
	return 0
}
