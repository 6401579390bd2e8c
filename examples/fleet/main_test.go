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
// checks what its table claims. The overload runs as long as the demo's:
// the back tier's limit takes about 0.75s to come down from its initial 20
// to the 5 or 6 its 2 workers can use, and the few Critical calls with a
// tight deadline it loses on the way are a smaller share of 4 seconds than
// of 2. The outage is shortened. In a synctest bubble the
// tiers' own CPU costs no time, so the figures are those of the policies
// alone; over loopback on a loaded machine the tiers' CPU adds latency.
func TestFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &inMemory{}
		defer n.close()
		sz := size{overload: 4 * time.Second, outage: time.Second}
		rs, err := run(io.Discard, n, sz)
		if err != nil {
			t.Fatal(err)
		}
		plain, rx := rs[0], rs[1]
		for _, r := range rs {
			t.Logf("%s: Critical %.2f%% (p99 %v), Bulk %.1f%%, back worked %d, wasted %d, sent %d, pushed back %d, throttled %d; outage back load %.2fx",
				r.mode, 100*r.critical.availability(), r.critical.quantile(0.99), 100*r.bulk.availability(),
				r.started, r.wasted, r.frontCalls+r.backCalls, r.pushedBack, r.throttled, r.outageLoad())
		}
		// Critical traffic is half the back's capacity: shedding Bulk
		// first keeps it whole (Netflix's figure: 99.4%).
		if a := rx.critical.availability(); a < 0.994 {
			t.Errorf("resilix: Critical availability %.2f%%, want >= 99.4%%", 100*a)
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
		// Pushback paces the flood rather than stopping it: the back tier
		// stays busy.
		if most := int64(0.9 * capacity * sz.overload.Seconds()); rx.started < most {
			t.Errorf("resilix: the back tier worked %d calls, want >= 90%% of its capacity, %d", rx.started, most)
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
