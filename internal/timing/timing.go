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

// stallLate: a timeout the client ended this long or more after its
// deadline is the client's own stall (see Stalled). A runtime timer on a
// busy host fires a few milliseconds late at worst: this is several
// times that.
const stallLate = 20 * time.Millisecond

// Stalled reports whether a timeout that the client ended late after its
// deadline was the client's own stall rather than the dependency's
// silence: its process did not run at the deadline (a GC pause, CPU
// starvation, a SIGSTOP), an answer may have come in time and waited
// unread, and every attempt whose deadline passed in the stall ends at
// once. Such a timeout is no evidence about the dependency.
func Stalled(late time.Duration) bool { return late >= stallLate }
