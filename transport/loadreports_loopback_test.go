package transport_test

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/resilix/resilix/transport"
)

// TestLoadReports is TestLoadPicking's fleet over real loopback: each
// replica its own http.Server on a 127.0.0.1 port behind admission.Handler
// (its limiter fixed at the replica's workers, so that its requests in
// flight are the work being done; service times timed waits, lognormal
// with a tail), eight clients as goroutine groups, each with its own
// transport and connections, open loop at 70% and 90% of the fleet's mean
// capacity. Round robin, peak-EWMA alone (today's picking with no
// reports) and load reports run in turn, lrRuns times each for d, and
// the table gives the median of the runs. It checks load reports against
// peak-EWMA: at 70%, p50 and p99 no worse (within lrSlack, the
// loopback's noise), admission's refusals at most lpRefused70; at 90%,
// p99 at most lpP99At90 × peak-EWMA's and p99.9 within lpSlack999; at
// both, the weak replica above 1.5 × its workers for at most lpOver at a
// stretch and refusals no more than peak-EWMA's. A machine too busy to
// serve the fleet on time stretches the service times (the notes give
// those the replicas' timers delivered, and the machine's load average)
// and then measures itself. It runs
// only when RESILIX_LOADREPORTS is set, to 1 or a Go duration replacing
// lrLength (`make loadreports` sets it); RESILIX_LOAD_PICKING_TRACE adds
// where admission's refusals came from, as in TestLoadPicking.
func TestLoadReports(t *testing.T) {
	d := optIn(t, "RESILIX_LOADREPORTS", lrLength, "a loopback measurement of picking by load reports; set RESILIX_LOADREPORTS=1 (or a duration for each run) to run it, as make loadreports does")
	pickers := []lpPicker{lpRoundRobin, lpPeakEWMA, lpReports}
	for _, load := range []float64{0.7, 0.9} {
		t.Run(fmt.Sprintf("load-%.0f%%", 100*load), func(t *testing.T) {
			res := make([]lpResult, len(pickers))
			before := transport.LoadAverage()
			for run := range lrRuns {
				for i, p := range pickers {
					func() {
						defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
						res[i].add(lpRun(t, &fbLoopback{}, p, load, uint64(run+1), d))
					}()
				}
			}
			tb := lpTable(load, pickers, res)
			tb.note(fmt.Sprintf("the machine's load average (1, 5 and 15 min) before: %s; after: %s", before, transport.LoadAverage()))
			lpCheck(tb, load, pickers, res, lrSlack, lpP99At90)
			tb.log(t, fmt.Sprintf("load reports, loopback: %s, %d runs of %v", lpFleet(load), lrRuns, d))
		})
	}
}

const (
	lrRuns   = 3
	lrLength = 8 * time.Second
	// lrSlack is how much worse than peak-EWMA's a quantile of load
	// reports may be, against the loopback's noise: the pickers' runs
	// follow each other on a machine whose load varies.
	lrSlack = 1.10
)
