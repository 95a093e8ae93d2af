//go:build !linux && !darwin

package sysmem

import "os"

func total() uint64 { return 0 }

// PeakRSS is the peak resident set size of the finished process ps
// describes: unknown (0) on this platform.
func PeakRSS(ps *os.ProcessState) int64 { return 0 }
