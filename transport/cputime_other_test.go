//go:build !unix

package transport

import "time"

// cpuTime cannot be read here: the benchmarks report no CPU time.
func cpuTime() time.Duration { return 0 }
