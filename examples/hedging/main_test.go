package main

import (
	"io"
	"net/http"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/httptestutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inMemory serves the upstream without sockets, so that the demo can run in
// a synctest bubble, where its latencies are exact.
func inMemory(up *httptestutil.Upstream) (string, func() http.RoundTripper, func()) {
	return "http://upstream.test", up.RoundTripper, func() {}
}

// TestDemo runs the demo in virtual time, at its own size, and checks what
// its table claims. Over loopback the same figures hold on an idle machine,
// but a loaded one's stalls land in the tail the table is about. The size
// matters: the brownout's first calls meet the calm threshold, rescanned
// at most every 0.94s, and then a window still mostly calm, so the budget
// caps the transition at about 50 hedges whatever the number of calls:
// over the demo's 1500 brownout calls that is near 5% extra, over 500 it is
// over 10%.
func TestDemo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rows, err := run(io.Discard, 3000, inMemory)
		if err != nil {
			t.Fatal(err)
		}
		plain, hedged, brownout := rows[0], rows[1], rows[2]
		t.Logf("p99 %v without hedging, %v with; extra wire calls %.1f%%, %.1f%% in the brownout",
			plain.res.Quantile(0.99), hedged.res.Quantile(0.99), 100*hedged.extra(), 100*brownout.extra())
		if p, h := plain.res.Quantile(0.99), hedged.res.Quantile(0.99); h*3 > p {
			t.Errorf("p99 %v with hedging vs %v without: want the slow mode cut by far more than 3x", h, p)
		}
		if e := hedged.extra(); e > 0.10 {
			t.Errorf("hedging cost %.1f%% extra wire calls, want near 5%%", 100*e)
		}
		if e := brownout.extra(); e > 0.10 {
			t.Errorf("the brownout cost %.1f%% extra wire calls; the live quantile should keep it near 5%%", 100*e)
		}
	})
}

// TestDemoOverLoopback runs the demo as make demo does, on real sockets,
// small, and checks only that every call got its answer: its latencies are
// the machine's as much as the upstream's.
func TestDemoOverLoopback(t *testing.T) {
	rows, err := run(io.Discard, 200, loopback)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.res.Failed > 0 {
			t.Errorf("%s, %s: %d of %d calls failed", r.phase, r.client, r.res.Failed, len(r.res.Latencies))
		}
	}
}
