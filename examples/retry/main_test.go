package main

import (
	"io"
	"math"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the demo over loopback and checks what its table claims,
// on counts rather than times.
func TestDemo(t *testing.T) {
	rows, err := run(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]row{}
	for _, r := range rows {
		got[r.upstream+"/"+r.client] = r
	}
	flaky := got["flaky (5% 503)/resilix"]
	if flaky.ok < callsPerRow*99/100 {
		t.Errorf("resilix against the flaky upstream: %d/%d succeeded, want at least 99%%", flaky.ok, callsPerRow)
	}
	// Down: the budget (Ratio 0.2, a 10/s floor, Max 20; failed retries
	// refund nothing) bounds the retries to 20% of the calls (120), the 20
	// tokens it held and the floor's 10 a second over the row's run (a
	// second or two, longer on a busy machine), and 5% of the calls for
	// the bucket's fractions: far below the 2 retries per call Attempts
	// would allow.
	down := got["down (all 503)/resilix"]
	most := callsPerRow*120/100 + 20 + 10*int(math.Ceil(down.took.Seconds())) + callsPerRow*5/100
	t.Logf("resilix against the down upstream: %d wire calls for %d calls in %v, at most %d", down.wire, callsPerRow, down.took, most)
	if down.wire > most {
		t.Errorf("resilix against the down upstream made %d wire calls for %d calls in %v; the budget caps it at %d", down.wire, callsPerRow, down.took, most)
	}
	if h := got["healthy/resilix"]; h.ok != callsPerRow || h.wire != callsPerRow {
		t.Errorf("healthy upstream: %+v, want every call to succeed on its first attempt", h)
	}
}
