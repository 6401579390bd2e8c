//go:build unix

package transport

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time the process has used, user and system, or
// 0 where it cannot be read. The benchmarks report it per call beside the
// wall time: on a machine shared with other work, the wall time of a call
// includes the slices other processes took, its CPU time does not.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
