package quantize

import "syscall"

// macOS reports ru_maxrss in bytes.
func maxRSSBytes(ru *syscall.Rusage) int64 { return ru.Maxrss }
