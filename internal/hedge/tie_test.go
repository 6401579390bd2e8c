package hedge

import (
	"testing"
	"time"
)

// TestTies walks a scope's knowledge of its upstream's ties over fixed
// instants: learned from the first signal, the delay twice the quickest
// signal of the window, the window's older half forgotten, and the
// upstream forgotten after three served legs in a row without a signal.
func TestTies(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var ties Ties
	type want struct {
		speaks bool
		delay  time.Duration // 0: none
	}
	check := func(step string, now time.Time, w want) {
		t.Helper()
		if got := ties.Speaks(); got != w.speaks {
			t.Errorf("%s: Speaks %v, want %v", step, got, w.speaks)
		}
		d, ok := ties.Delay(now)
		if ok != (w.delay > 0) || d != w.delay {
			t.Errorf("%s: Delay %v %v, want %v", step, d, ok, w.delay)
		}
	}
	check("new", t0, want{})
	ties.Served(false)
	check("served before any signal", t0, want{})

	ties.Signalled(at(0), 3*time.Millisecond)
	check("first signal", at(0), want{true, 6 * time.Millisecond})
	ties.Signalled(at(time.Second), 5*time.Millisecond)
	check("a slower signal", at(time.Second), want{true, 6 * time.Millisecond})
	ties.Signalled(at(2*time.Second), time.Millisecond)
	check("a quicker signal", at(2*time.Second), want{true, 2 * time.Millisecond})

	// The half-window of t0 ends at 10s: the quickest is kept through the
	// next half-window, and gone after it.
	ties.Signalled(at(12*time.Second), 4*time.Millisecond)
	check("next half-window", at(12*time.Second), want{true, 2 * time.Millisecond})
	check("two half-windows later", at(21*time.Second), want{true, 8 * time.Millisecond})
	check("no signal within the window", at(45*time.Second), want{speaks: true})

	ties.Signalled(at(50*time.Second), 2*time.Millisecond)
	ties.Served(false)
	ties.Served(false)
	ties.Served(true) // a signal between: the silence is not in a row
	ties.Served(false)
	ties.Served(false)
	check("two silent in a row", at(50*time.Second), want{true, 4 * time.Millisecond})
	ties.Served(false)
	check("three silent in a row", at(50*time.Second), want{})
	ties.Signalled(at(51*time.Second), 3*time.Millisecond)
	check("a signal again", at(51*time.Second), want{true, 6 * time.Millisecond})
	ties.Signalled(at(52*time.Second), 0)
	check("a signal in no time", at(52*time.Second), want{true, minTieDelay})
}
