package mlxpack

import "syscall"

func maxRSSBytes(ru *syscall.Rusage) int64 { return ru.Maxrss << 10 }
