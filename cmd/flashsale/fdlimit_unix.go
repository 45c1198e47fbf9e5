//go:build unix

package main

import "syscall"

// openFileLimit is the process's soft limit on open descriptors (Go raises it
// to the hard limit at start).
func openFileLimit() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<20 {
		return 1 << 20
	}
	return int(lim.Cur)
}
