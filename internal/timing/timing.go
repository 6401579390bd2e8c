// Package timing holds the one way resilix waits, a sleep that the
// caller's context cuts short, and its cheaper reading of the clock.
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

// Since returns the time now as t plus the time elapsed since t. When t
// has a monotonic clock reading (any time.Now outside a testing/synctest
// bubble), that reads the monotonic clock alone, where time.Now reads the
// wall clock too, which costs more (BenchmarkSince measures both). The
// result keeps t's monotonic reading plus the elapsed time, so comparing and subtracting it with other times is
// exact; its wall clock is t's plus the elapsed time, which differs from
// time.Now's only if the wall clock was set in between. Without a
// monotonic reading it is time.Now.
func Since(t time.Time) time.Time {
	return t.Add(time.Since(t))
}
