//go:build !unix

package redisrate

// runChild never runs a fleet's process here: the tests that run Redis
// need a Unix.
func runChild() (code int, ok bool) { return 0, false }
