package fsutil

import (
	"os"
	"strings"
)

// bootIDOS is the kernel's random boot id, new at every boot.
func bootIDOS() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
