//go:build race

package transport

// raceEnabled: the race detector makes sync.Pool drop a share of what is
// put in it, so allocation counts of pooled code mean nothing under it.
const raceEnabled = true
