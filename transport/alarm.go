package transport

import (
	"context"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/resilix/resilix/policy"
)

// An alarm is the timer of a per-attempt timeout: a time.AfterFunc timer
// that cancels the attempt's context with policy.ErrAttemptTimeout at a
// time set when it is armed, unless stop disarms it first.
//
// Nearly every per-attempt timeout is disarmed long before it is due
// (headers come back in a small part of PerAttempt), so disarming and
// re-arming one touch no runtime timer: stop only clears the time, and
// the timer, left set, fires when it was due, finds nothing to do and
// rests. An alarm goes back to a pool when stopped, and the next call
// moves its timer only when the timer is not already set for an earlier
// time; a timer that fires before the alarm is due sets itself again for
// what is left. So a call that ends before its timeout costs a lock and
// an unlock where a timer's Reset and Stop cost twice as much
// (BenchmarkRoundTrip's retry+timeout measures it), and a timer may
// fire once, idle, up to a PerAttempt after its last call, holding
// nothing of that call. The trade is lost when PerAttempt is within a
// few times the latency: each fire is a goroutine, and a timer kept busy
// by calls in flight fires every PerAttempt, where stopped timers fire
// only for the calls that time out.
//
// A hedged round's timer, due at the hedge threshold (about the
// latency's p95), would be in that case on every call, so it is a
// roundTimer, stopped when the inline leg comes back before it fires.
//
// Only a call made outside a testing/synctest bubble takes a timer from
// a pool: a timer belongs to the bubble it was created in, and one
// created in a bubble that has ended would never fire in the next. A call
// inside a bubble gets a fresh one, which is dropped after use. A call
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
	// cancel cancels the attempt when the alarm is due; nil while it is
	// disarmed, so that an alarm in the pool holds nothing of a call.
	cancel context.CancelCauseFunc
}

// alarms holds the pooled alarms, disarmed.
var alarms sync.Pool

// newAlarm returns an alarm armed for at, which then calls
// cancel(policy.ErrAttemptTimeout). start is the call's start time, which
// says whether the call runs in a synctest bubble.
func newAlarm(start, at time.Time, cancel context.CancelCauseFunc) *alarm {
	pooled := !inBubble(start)
	if pooled {
		if a, _ := alarms.Get().(*alarm); a != nil {
			a.rearm(at, cancel)
			return a
		}
	}
	a := &alarm{pooled: pooled, at: at, set: at, cancel: cancel}
	a.mu.Lock() // fire may run before a.t is assigned
	if pooled {
		// The pool drops what it holds at garbage collections, and a
		// disarmed alarm's timer may still be set for up to a
		// PerAttempt. The timer reaches the alarm through a weak
		// pointer, so that a dropped alarm is collected (and its
		// timer stopped) rather than kept until the timer fires: else
		// each swing of concurrency would leave alarms behind for a
		// PerAttempt.
		w := weak.Make(a)
		a.t = time.AfterFunc(time.Until(at), func() {
			if a := w.Value(); a != nil {
				a.fire()
			}
		})
		runtime.AddCleanup(a, func(t *time.Timer) { t.Stop() }, a.t)
	} else {
		a.t = time.AfterFunc(time.Until(at), a.fire)
	}
	a.mu.Unlock()
	return a
}

// rearm arms a stopped alarm again, for at and cancel. Its timer moves
// only when it is not set, or set for later than at.
func (a *alarm) rearm(at time.Time, cancel context.CancelCauseFunc) {
	a.mu.Lock()
	a.at, a.cancel = at, cancel
	if a.set.IsZero() || at.Before(a.set) {
		a.set = at
		a.t.Reset(time.Until(at))
	}
	a.mu.Unlock()
}

// fire runs when the timer fires: it cancels the attempt if the alarm is
// due, sets the timer again if the alarm is armed for later, and
// otherwise lets the timer rest.
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
	cancel := a.cancel
	a.mu.Unlock()
	cancel(policy.ErrAttemptTimeout)
}

// stop disarms the alarm and reports whether it was disarmed before it
// rang, as time.Timer.Stop does. The alarm must not be used again: it goes
// back to the pool when it came from there. A cancel it has begun runs on
// without it.
func (a *alarm) stop() bool {
	a.mu.Lock()
	armed := !a.at.IsZero()
	a.at, a.cancel = time.Time{}, nil
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
