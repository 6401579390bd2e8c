package main

import (
	"io"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFleet runs the demo in virtual time with the in-memory network, and
// checks what its table claims. The overload runs longer than the demo's
// 4 s, so that 500 Critical calls come after the first second, in which the
// back tier's limit comes down from its initial 20 to the 5 or 6 its
// workers can use. The outage is shortened.
//
// The back tier's use is printed, not asserted: with pushback pacing Bulk
// to the rate the back tier accepts it worked 68% to 100% of its capacity
// in runs under the race detector beside a CPU hog, as the pace's search
// varies with the scheduling.
func TestFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &inMemory{}
		defer n.close()
		sz := size{overload: 6 * time.Second, outage: time.Second}
		rs, err := run(io.Discard, n, sz)
		if err != nil {
			t.Fatal(err)
		}
		plain, rx := rs[0], rs[1]
		for _, r := range rs {
			t.Logf("%s: Critical %.2f%% (%.2f%% after the first second; p99 %v), Bulk %.1f%%, back worked %d, wasted %d, sent %d, pushed back %d, throttled %d; outage back load %.2fx",
				r.mode, 100*r.critical.availability(), 100*r.critical.settledAvailability(), r.critical.quantile(0.99), 100*r.bulk.availability(),
				r.started, r.wasted, r.frontCalls+r.backCalls, r.pushedBack, r.throttled, r.outageLoad())
		}
		// Critical traffic is half the back's capacity: shedding Bulk
		// first keeps it whole (Netflix's figure: 99.4%) once the limits
		// have found the flood. In the first second the back tier's limit
		// comes down from its initial 20 to the 5 or 6 its workers can use,
		// and a few Critical calls with a tight deadline miss it: 0 to 7
		// of 400 in a 4 s run, 0 to 3 of 600 in this one. Of the 500 that
		// come after the first second, none miss in most runs (16 of 16,
		// 8 of them under the race detector), but the scheduling of the
		// bubble's goroutines under the race detector now and then lets 4
		// to 6 miss (99.20% in one quiet run, 98.80% in one beside two CPU
		// hogs): the bound is 7 of 500.
		if a := rx.critical.settledAvailability(); a < 0.985 {
			t.Errorf("resilix: Critical availability %.2f%% after the first second, want >= 98.5%%", 100*a)
		}
		if a := rx.critical.availability(); a < 0.98 {
			t.Errorf("resilix: Critical availability %.2f%%, want >= 98%%", 100*a)
		}
		if a, p := rx.critical.availability(), plain.critical.availability(); a <= p {
			t.Errorf("Critical availability %.2f%% with resilix, %.2f%% without: want better", 100*a, 100*p)
		}
		// Deadlines travel: the back never starts work whose caller is gone.
		if rx.wasted != 0 {
			t.Errorf("resilix: the back tier started %d calls after their caller gave up, want 0", rx.wasted)
		}
		if rx.pushedBack == 0 {
			t.Errorf("resilix: no attempt was held back on pushback: the flood was never pushed back")
		}
		// Retries do not multiply: naive retries at two tiers send up to
		// 9 calls a logical call to a dead back tier; budgets and the
		// attempt rule keep it near the offered load.
		if l := rx.outageLoad(); l > 1.2 {
			t.Errorf("resilix: back load during the outage %.2fx the offered load, want <= 1.2x", l)
		}
		if l := plain.outageLoad(); l < 5 {
			t.Errorf("plain: back load during the outage %.2fx the offered load, want the naive retries' multiplication (near 9x)", l)
		}
	})
}
