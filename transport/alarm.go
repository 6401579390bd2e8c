package transport

import (
	"context"
	"sync"
	"time"

	"github.com/resilix/resilix/policy"
)

// An alarm is the timer of a per-attempt timeout or of a hedged round: a
// time.AfterFunc timer that rings at a time set by arm, unless stop
// disarms it first.
//
// Nearly every alarm is disarmed before it is due (headers come back
// before the timeout), so disarming and re-arming touch no runtime timer:
// stop only clears the time, and the timer, left set, fires when it was
// due, finds nothing to do and rests. An alarm disarmed in time goes back
// to a pool, and the next call's arm moves its timer only when the timer
// is not already set for an earlier time; a timer that fires before the
// alarm is due sets itself again for what is left. So a call that ends
// before its timeout costs a lock and an unlock where a timer's Reset
// and Stop cost twice as much (the per-attempt timeout of
// BenchmarkRoundTrip), and a timer may fire once, idle, up to a timeout
// after its last call; it holds nothing of that call.
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

	mu sync.Mutex
	// at is when the alarm is due; zero when it is disarmed (stopped, or
	// rung and not armed again).
	at time.Time
	// set is when the timer is set to fire; zero when it is not set.
	set time.Time
	// When the alarm is due, ring calls round.fire, or, when round is
	// nil, cancel(policy.ErrAttemptTimeout); both are nil while it is
	// disarmed, so that an alarm in the pool holds nothing of a call.
	round  *round
	cancel context.CancelCauseFunc
}

// alarms holds the pooled alarms, disarmed.
var alarms sync.Pool

// newAlarm returns an alarm armed for at, which rings r.fire when r is not
// nil, else cancel(policy.ErrAttemptTimeout). start is the call's start
// time, which says whether the call runs in a synctest bubble.
func newAlarm(start, at time.Time, r *round, cancel context.CancelCauseFunc) *alarm {
	pooled := !inBubble(start)
	if pooled {
		if a, _ := alarms.Get().(*alarm); a != nil {
			a.mu.Lock()
			a.round, a.cancel = r, cancel
			a.armLocked(at)
			a.mu.Unlock()
			return a
		}
	}
	a := &alarm{pooled: pooled, at: at, set: at, round: r, cancel: cancel}
	a.mu.Lock() // fire may run before a.t is assigned
	a.t = time.AfterFunc(time.Until(at), a.fire)
	a.mu.Unlock()
	return a
}

// arm sets the alarm for at, which replaces any time it was set for.
func (a *alarm) arm(at time.Time) {
	a.mu.Lock()
	a.armLocked(at)
	a.mu.Unlock()
}

func (a *alarm) armLocked(at time.Time) {
	a.at = at
	if a.set.IsZero() || at.Before(a.set) {
		a.set = at
		a.t.Reset(time.Until(at))
	}
}

// fire runs when the timer fires: it rings the alarm if it is due, sets
// the timer again if the alarm is armed for later, and otherwise lets the
// timer rest.
func (a *alarm) fire() {
	now := time.Now()
	a.mu.Lock()
	a.set = time.Time{}
	switch {
	case a.at.IsZero():
		a.mu.Unlock()
		return
	case now.Before(a.at):
		a.set = a.at
		a.t.Reset(a.at.Sub(now))
		a.mu.Unlock()
		return
	}
	a.at = time.Time{}
	r, cancel := a.round, a.cancel
	a.mu.Unlock()
	if r != nil {
		r.fire(now)
		return
	}
	cancel(policy.ErrAttemptTimeout)
}

// stop disarms the alarm and reports whether it was disarmed before it
// rang, as time.Timer.Stop does. The alarm must not be used again: it goes
// back to the pool when it came from there. Whatever ring it has begun
// runs on without it.
func (a *alarm) stop() bool {
	a.mu.Lock()
	armed := !a.at.IsZero()
	a.at, a.round, a.cancel = time.Time{}, nil, nil
	a.mu.Unlock()
	if a.pooled {
		alarms.Put(a)
	}
	return armed
}

// inBubble reports whether a time read by time.Now was read inside a
// testing/synctest bubble, where time.Now returns no monotonic clock
// reading (runtime.time_now). TestInBubble holds this to the Go release
// in use.
func inBubble(now time.Time) bool {
	return now == now.Round(0)
}
