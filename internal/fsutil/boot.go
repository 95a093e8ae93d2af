package fsutil

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
)

// BootID identifies the current boot: the kernel's boot id on Linux, the
// boot session UUID on macOS, elsewhere a random value of this process
// alone. Two calls in one boot give the same value, and no value survives
// a reboot. A writer that skips fsync puts it into the stamp of its resume
// journal, so that after a power loss or a crash of the system — a
// reboot, when pages that were never written back are gone — the journal
// is not trusted and the output starts over; a kill or Ctrl-C does not
// lose the page cache, and the same boot resumes as usual. It is a
// variable so that a test can pretend a reboot happened.
var BootID = sync.OnceValue(func() string {
	if id := bootIDOS(); id != "" {
		return "boot " + id
	}
	var b [16]byte
	rand.Read(b[:])
	return "process " + hex.EncodeToString(b[:])
})
