package main

import (
	"io"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs a smaller demo over loopback and checks what its table
// claims, on ratios rather than absolute times.
func TestDemo(t *testing.T) {
	rows, err := run(io.Discard, 1000)
	if err != nil {
		t.Fatal(err)
	}
	plain, hedged, brownout := rows[0], rows[1], rows[2]
	if p, h := plain.res.Quantile(0.99), hedged.res.Quantile(0.99); h*3 > p {
		t.Errorf("p99 %v with hedging vs %v without: want the slow mode cut by far more than 3x", h, p)
	}
	// About 1 - q = 5%; allow for a noisy 2-core machine.
	if e := hedged.extra(); e > 0.10 {
		t.Errorf("hedging cost %.1f%% extra wire calls, want near 5%%", 100*e)
	}
	if e := brownout.extra(); e > 0.10 {
		t.Errorf("the brownout cost %.1f%% extra wire calls; the live quantile should keep it near 5%%", 100*e)
	}
}
