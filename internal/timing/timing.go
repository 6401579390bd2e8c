// Package timing holds the one way resilix waits: a sleep that the
// caller's context cuts short.
package timing

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done, and reports whether ctx is still
// live: true when d elapsed first (or d <= 0 and ctx is live). It stops
// its timer on every path.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
