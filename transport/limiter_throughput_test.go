package transport

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// The limiter's cost on a healthy upstream, and its targets: calls a
// second over bare net/http's, in the same run, best of ltTries tries.
const (
	ltCallers = 16
	// ltSlice is one configuration's turn: short, so that the machine's
	// other load falls on every configuration alike.
	ltSlice = 50 * time.Millisecond
	// ltRounds is the turns of each configuration in one try, in an
	// order shuffled each round, so that each follows every other alike
	// (a turn after one of its own finds its connections and caches warm).
	ltRounds = 24
	ltTries  = 3
	// ltSample is how often the limit and the in-flight count are read
	// during a turn.
	ltSample = time.Millisecond
	// ltMaxFailed is the most of a configuration's calls that may fail or
	// be refused.
	ltMaxFailed = 0.001
)

// TestLimiterThroughput measures what the adaptive limiter costs an
// upstream that is never overloaded: a loopback handler that answers at
// once, ltCallers closed-loop callers, bare net/http against resilix with
// the Limiter alone (target 0.97× bare's calls a second), with every policy
// but Hedge (0.90×), and with the Limiter alone and callers that call again
// at once when refused (0.90×; the others wait 1 ms), each with fewer than
// ltMaxFailed of its calls failed or refused. A second bare net/http
// client, with no target, shows the method's own spread. Each configuration
// has its own *http.Transport to the same server. They take turns of
// ltSlice, ltRounds each per try in a shuffled order, and each one's calls
// a second are divided by bare's of the same try; the best of ltTries tries
// is checked against the target. For each limiter it prints the mean limit,
// how often the calls in flight stood at it and how often a call waited
// for a slot, its shrinks and growths, and the limit at the end of each
// turn; for every configuration the process's CPU a call over bare's. It runs only when RESILIX_LIMITER_THROUGHPUT is
// set (make limiter-throughput), without -race, whose slowdown would be
// what it measures.
func TestLimiterThroughput(t *testing.T) {
	if os.Getenv("RESILIX_LIMITER_THROUGHPUT") == "" {
		t.Skip("a loopback measurement of the limiter's cost on a healthy upstream; set RESILIX_LIMITER_THROUGHPUT=1 to run it, as make limiter-throughput does")
	}
	srv := httptest.NewServer(httptestutil.NewUpstream(httptestutil.Options{}))
	defer srv.Close()
	key := strings.TrimPrefix(srv.URL, "http://")

	allButHedge := fullSet()
	allButHedge.Hedge = nil
	cfgs := []*ltConfig{
		{name: "bare net/http"},
		{name: "bare net/http again"}, // no target: the method's own spread
		{name: "Limiter", set: &policy.Set{Limiter: &policy.Limiter{}}, pause: time.Millisecond, target: 0.97},
		{name: "every policy but Hedge", set: &allButHedge, pause: time.Millisecond, target: 0.90},
		{name: "Limiter, refused call again at once", set: &policy.Set{Limiter: &policy.Limiter{}}, target: 0.90},
	}
	for _, c := range cfgs {
		base := &http.Transport{MaxIdleConnsPerHost: 2 * ltCallers}
		defer base.CloseIdleConnections()
		c.client = &http.Client{Transport: base}
		if c.set != nil {
			tr, err := New(Config{Base: base, Policies: *c.set, Observer: &policy.Observer{LimitTransition: c.transition}})
			if err != nil {
				t.Fatal(err)
			}
			c.tr = tr
			c.client = &http.Client{Transport: tr}
		}
		closedLoop(c.client, srv.URL, ltCallers, 3*ltSlice, c.pause) // warm up
	}
	t.Logf("load average before: %s", LoadAverage())
	ratios := make([][]float64, len(cfgs))
	rng := rand.New(rand.NewPCG(46, 1)) // the turns' order
	for try := range ltTries {
		for _, c := range cfgs {
			c.reset()
		}
		for range ltRounds {
			for _, i := range rng.Perm(len(cfgs)) {
				cfgs[i].turn(srv.URL, key)
			}
		}
		t.Logf("try %d: bare net/http %.1fk calls/s, %.1f µs of CPU a call; load average %s", try+1, cfgs[0].run.rate()/1000, cfgs[0].cpuPerCall(), LoadAverage())
		t.Logf("| configuration | calls/s | × bare | CPU µs a call over bare's | failed or refused | mean limit (range) | in flight at the limit | a call waiting | shrinks, growths |")
		for i, c := range cfgs[1:] {
			ratio := c.run.rate() / cfgs[0].run.rate()
			ratios[i+1] = append(ratios[i+1], ratio)
			row := fmt.Sprintf("| %s | %.1fk | %.3f | %+.1f | %.3g%% |", c.name, c.run.rate()/1000, ratio, c.cpuPerCall()-cfgs[0].cpuPerCall(), 100*c.run.failedShare())
			if c.tr != nil {
				row += fmt.Sprintf(" %.1f (%d–%d) | %.1f%% | %.1f%% | %d, %d |", c.limits.mean(), c.limits.lo, c.limits.hi,
					100*c.limits.atLimitShare(), 100*c.limits.queuedShare(), c.shrinks.Load(), c.growths.Load())
			}
			t.Log(row)
			if c.run.failedShare() > ltMaxFailed {
				t.Errorf("%s: %.3g%% of calls failed or refused, target < %.3g%%", c.name, 100*c.run.failedShare(), 100*ltMaxFailed)
			}
		}
		for _, c := range cfgs {
			if c.tr != nil {
				t.Logf("limit at the end of each turn of %s: %v", c.name, c.limits.ends)
			}
		}
	}
	t.Logf("load average after: %s", LoadAverage())
	for i, c := range cfgs[1:] {
		best := slices.Max(ratios[i+1])
		if c.target == 0 {
			t.Logf("%s: %.3f× bare net/http (tries %.3f), the method's own spread", c.name, best, ratios[i+1])
			continue
		}
		t.Logf("%s: best of %d %.3f× bare net/http (tries %.3f), target >= %.2f×", c.name, ltTries, best, ratios[i+1], c.target)
		if best < c.target {
			t.Errorf("%s: best of %d tries %.3f× bare net/http, target >= %.2f×", c.name, ltTries, best, c.target)
		}
	}
}

// ltConfig is one configuration of TestLimiterThroughput and what its
// turns counted.
type ltConfig struct {
	name   string
	set    *policy.Set   // nil: bare net/http
	pause  time.Duration // a refused caller's wait before its next call
	target float64       // the least ratio to bare net/http

	client *http.Client
	tr     *Transport

	run              loopResult
	cpu              time.Duration // the process's, during c's turns
	limits           ltLimits
	shrinks, growths atomic.Int64
}

func (c *ltConfig) transition(lt policy.LimitTransition) {
	if lt.To < lt.From {
		c.shrinks.Add(1)
	} else {
		c.growths.Add(1)
	}
}

// cpuPerCall is the process's CPU time (client and server) per call
// answered during c's turns, in µs.
func (c *ltConfig) cpuPerCall() float64 {
	return float64(c.cpu.Microseconds()) / float64(max(c.run.ok, 1))
}

func (c *ltConfig) reset() {
	c.run, c.limits, c.cpu = loopResult{}, ltLimits{}, 0
	c.shrinks.Store(0)
	c.growths.Store(0)
}

// turn runs c's callers for ltSlice, reading its limit every ltSample
// meanwhile.
func (c *ltConfig) turn(url, key string) {
	read := func() {} // bare: the same ticks, so that they cost every configuration alike
	if c.tr != nil {
		read = func() {
			m := c.tr.Measured(key)
			c.limits.add(m.LimiterLimit, m.LimiterInFlight, m.LimiterQueued)
		}
	}
	cpu := cpuTime()
	c.run.add(sampledLoop(c.client, url, ltCallers, ltSlice, c.pause, ltSample, read))
	c.cpu += cpuTime() - cpu
	if c.tr != nil {
		c.limits.ends = append(c.limits.ends, c.tr.Measured(key).LimiterLimit)
	}
}

// ltLimits sums the limit as read during a configuration's turns.
type ltLimits struct {
	n, sum, atLimit, queued int
	lo, hi                  int
	ends                    []int // the limit at the end of each turn
}

func (l *ltLimits) add(limit, inFlight, queued int) {
	if l.n == 0 || limit < l.lo {
		l.lo = limit
	}
	l.hi = max(l.hi, limit)
	l.n++
	l.sum += limit
	if inFlight >= limit {
		l.atLimit++
	}
	if queued > 0 {
		l.queued++
	}
}

func (l *ltLimits) mean() float64 { return float64(l.sum) / float64(max(l.n, 1)) }

// atLimitShare is the share of readings with the calls in flight at the
// limit.
func (l *ltLimits) atLimitShare() float64 { return float64(l.atLimit) / float64(max(l.n, 1)) }

// queuedShare is the share of readings with a call waiting for a slot:
// the limit holding calls back.
func (l *ltLimits) queuedShare() float64 { return float64(l.queued) / float64(max(l.n, 1)) }

// failedShare is the share of calls that failed or were refused.
func (r loopResult) failedShare() float64 {
	return float64(r.refused+r.other) / float64(max(r.ok+r.refused+r.other, 1))
}

// LoadAverage is the machine's load average over 1, 5 and 15 minutes,
// as /proc/loadavg says, or "unknown": for the loopback harnesses' notes,
// those of package transport_test too.
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
