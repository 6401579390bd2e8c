package transport

import (
	"context"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
)

// An alarm is the timer of a per-attempt timeout or of a hedged round: a
// time.AfterFunc timer that, once stopped before it fired, is kept for
// the next call, so that arming one costs neither the timer nor its func
// (two allocations of the three a timed attempt would otherwise make
// beyond its context).
//
// Only a call made outside a testing/synctest bubble takes an alarm from
// the pool: a timer belongs to the bubble it was created in, and one
// created in a bubble that has ended would never fire in the next. A call
// inside a bubble gets a fresh alarm, which is dropped after use. A call
// tells which it is by its start time, which has no monotonic clock
// reading inside a bubble (see inBubble).
type alarm struct {
	t      *time.Timer
	pooled bool
	// When the timer fires, ring calls round.fire, or, when round is
	// nil, cancel(policy.ErrAttemptTimeout). Both are set before the
	// timer is armed and read only by ring.
	round  *round
	cancel context.CancelCauseFunc
}

// alarms holds the pooled alarms, stopped.
var alarms sync.Pool

func (a *alarm) ring() {
	if r := a.round; r != nil {
		r.fire()
		return
	}
	a.cancel(policy.ErrAttemptTimeout)
}

// newAlarm arms an alarm that fires after d: r.fire when r is not nil,
// else cancel(policy.ErrAttemptTimeout). start is the call's start time,
// which says whether the call runs in a synctest bubble.
func newAlarm(start time.Time, d time.Duration, r *round, cancel context.CancelCauseFunc) *alarm {
	if inBubble(start) {
		a := &alarm{round: r, cancel: cancel}
		a.t = time.AfterFunc(d, a.ring)
		return a
	}
	a, _ := alarms.Get().(*alarm)
	if a == nil {
		a = &alarm{pooled: true, round: r, cancel: cancel}
		a.t = time.AfterFunc(d, a.ring)
		return a
	}
	a.round, a.cancel = r, cancel
	a.t.Reset(d)
	return a
}

// stop stops the alarm and reports whether it was stopped before it fired,
// as time.Timer.Stop does. An alarm stopped in time goes back to the pool
// (when it came from there), and must not be used again: its ring cannot
// be running, and its fields are only read by ring. One that fired is
// left to the garbage collector, since its ring may still be running.
func (a *alarm) stop() bool {
	if !a.t.Stop() {
		return false
	}
	if a.pooled {
		a.round, a.cancel = nil, nil
		alarms.Put(a)
	}
	return true
}

// inBubble reports whether a time read by time.Now was read inside a
// testing/synctest bubble, where time.Now returns no monotonic clock
// reading (runtime.time_now). TestInBubble holds this to the Go release
// in use.
func inBubble(now time.Time) bool {
	return now == now.Round(0)
}
