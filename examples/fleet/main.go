// Command fleet shows overload handled as a conversation between tiers:
// priority, tenant and deadline travel with every call, each service sheds
// by priority with package admission, and clients obey the pushback they
// get. It runs three tiers over loopback in one process:
//
//	load generator → front service → back service
//
// The back service has a fixed capacity: 2 workers, 10ms of work a call,
// 200 calls a second. (The shape of the 8 workers × 5ms, scaled
// down so that a flood of 12 times the capacity fits on a 2-core machine
// with room left for the tiers themselves.) Steady Critical traffic at half
// the back's capacity meets a Bulk flood of 12 times it, and a share of the
// callers has a tight deadline. The same fleet is run twice: with plain
// net/http clients and handlers, naive retries at each tier (3 tries), and
// with resilix on both tiers: admission in front of each service, a
// resilix transport with Propagate on as each client. A second phase takes
// the back tier down and measures the load that reaches it.
//
//	go run ./examples/fleet
package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"
)

func main() {
	if _, err := run(os.Stdout, &loopback{}, demoSize); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// size is how long each phase runs.
type size struct{ overload, outage time.Duration }

var demoSize = size{overload: 4 * time.Second, outage: 2 * time.Second}

// The fleet's shape.
const (
	backWorkers   = 2
	backWork      = 10 * time.Millisecond
	capacity      = float64(backWorkers) * float64(time.Second/backWork) // calls a second
	criticalRate  = capacity / 2
	bulkRate      = 12 * capacity
	deadline      = time.Second
	tightShare    = 0.2
	tightDeadline = 100 * time.Millisecond
	warmup        = time.Second
	settle        = time.Second  // how long the limits take to find the flood
	outageRate    = capacity / 2 // of each class
)

// result is what one mode measured.
type result struct {
	mode           string
	critical, bulk *class
	started        int64 // calls the back tier worked on
	wasted         int64 // of those, after their caller had given up
	frontCalls     int64 // calls that reached the front tier
	backCalls      int64 // calls that reached the back tier
	pushedBack     int64 // attempts a client held back on a server's pushback
	throttled      int64 // attempts a client's throttler refused on its own estimate

	outageOffered int64 // logical calls made while the back tier was down
	outageBack    int64 // calls that reached the back tier meanwhile
}

func (r result) outageLoad() float64 {
	if r.outageOffered == 0 {
		return 0
	}
	return float64(r.outageBack) / float64(r.outageOffered)
}

func run(w io.Writer, n network, sz size) ([]result, error) {
	var out []result
	for _, m := range []fleetMode{plainMode{}, resilixMode{}} {
		r, err := measure(n, m, sz)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	print(w, out, sz)
	return out, nil
}

func print(w io.Writer, rs []result, sz size) {
	fmt.Fprintf(w, "overload, %v: Critical %.0f/s and Bulk %.0f/s (12x) on a back tier of %.0f calls/s; %.0f%% of calls with a %v deadline, the others %v\n\n",
		sz.overload, criticalRate, bulkRate, capacity, 100*tightShare, tightDeadline, deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fleet\tCritical ok\tCritical p99\tBulk ok\tback worked\twasted\tsent\tpushed back\tthrottled\tback load, outage\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%.2f%%\t%v\t%.1f%%\t%d\t%d\t%d\t%d\t%d\t%.2fx\t\n",
			r.mode, 100*r.critical.availability(), r.critical.quantile(0.99).Round(100*time.Microsecond),
			100*r.bulk.availability(), r.started, r.wasted, r.frontCalls+r.backCalls, r.pushedBack, r.throttled, r.outageLoad())
	}
	tw.Flush()
	fmt.Fprintf(w, `
"wasted": calls the back tier started working on after their caller had
given up. "sent": calls that reached a service (front and back); "pushed
back" and "throttled": attempts the clients refused before the wire, on a
server's 429 or 503 with Retry-After and on their own estimate of the
refusals. "back load, outage": calls reaching the back tier while it was
down for %v, per logical call offered (naive retries at two tiers: up to
9x).
`, sz.outage)
}
