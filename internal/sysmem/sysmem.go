// Package sysmem says how much memory the machine has, for defaults that
// are a share of it (the pipeline runner's memory budget).
package sysmem

// Total returns the machine's physical memory in bytes, or 0 when it
// cannot tell.
func Total() uint64 { return total() }
