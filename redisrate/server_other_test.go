//go:build unix && !linux

package redisrate

import "os/exec"

// dieWithParent does nothing here: only Linux kills a child with its
// parent. The tests' cleanups kill what they started.
func dieWithParent(*exec.Cmd) {}
