package main

import "syscall"

// Darwin reports ru_maxrss in bytes.
func maxRSSKiB(ru *syscall.Rusage) int64 { return ru.Maxrss / 1024 }
