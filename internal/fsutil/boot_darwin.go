package fsutil

import "golang.org/x/sys/unix"

// bootIDOS is the kernel's boot session UUID, new at every boot.
func bootIDOS() string {
	id, err := unix.Sysctl("kern.bootsessionuuid")
	if err != nil {
		return ""
	}
	return id
}
