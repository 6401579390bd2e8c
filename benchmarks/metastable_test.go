package benchmarks

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/resilix/resilix/policy"
)

// The metastability experiment (make metastable; see README.md's
// "Metastable failure"): a server of fixed capacity that works on whatever
// it has queued, whether its caller is still there or not, an open-loop
// load at 80% of that capacity, and a trigger that divides the capacity by
// five for a few seconds. What it measures is whether each client lets the
// server come back once the trigger is over.

// slot is the resolution of every series: calls are counted in the slot
// they were issued in, the server's work in the slot it happened in.
const slot = 100 * time.Millisecond

// scenario is one run's shape. The zero durations are not valid.
type scenario struct {
	rate     int           // calls offered a second, open loop, at fixed times
	deadline time.Duration // the caller's deadline for each call
	workers  int           // the server's workers
	service  time.Duration // each request's service time, a timed wait
	slowdown int           // the factor on service during the trigger
	calm     time.Duration // before the trigger
	trigger  time.Duration // how long the trigger lasts
	after    time.Duration // measured after the trigger's end
}

// metastableRun is the experiment make metastable runs: 8 workers at
// 10 ms (800 calls a second), 640 calls a second offered (80%), a 1 s
// deadline, and 5 s at 5× the service time (160 calls a second) after 3 s
// of calm.
var metastableRun = scenario{
	rate: 640, deadline: time.Second, workers: 8, service: 10 * time.Millisecond, slowdown: 5,
	calm: 3 * time.Second, trigger: 5 * time.Second, after: 15 * time.Second,
}

func (sc scenario) total() time.Duration { return sc.calm + sc.trigger + sc.after }
func (sc scenario) slots() int           { return int(sc.total() / slot) }
func (sc scenario) triggerSlots() (from, to int) {
	return int(sc.calm / slot), int((sc.calm + sc.trigger) / slot)
}

// series is what one run counted, per slot.
type series struct {
	offered, good []int64       // calls issued in the slot; those that succeeded within their deadline
	arrivals      []int64       // requests whose handler started, at the server(s) being measured
	completed     []int64       // work finished
	orphaned      []int64       // work finished for a caller that had gone
	queue         []int64       // requests waiting for a worker, sampled at the slot's end
	conns         []int64       // connections the server(s) accepted
	lost          time.Duration // worker time the machine took from the server(s) while busy
}

func newSeries(n int) *series {
	return &series{
		offered: make([]int64, n), good: make([]int64, n), arrivals: make([]int64, n),
		completed: make([]int64, n), orphaned: make([]int64, n), queue: make([]int64, n), conns: make([]int64, n),
	}
}

// counters is a series being filled concurrently.
type counters struct {
	start                                               time.Time
	offered, good, arrivals, completed, orphaned, conns []atomic.Int64
}

func newCounters(start time.Time, n int) *counters {
	return &counters{
		start: start, offered: make([]atomic.Int64, n), good: make([]atomic.Int64, n),
		arrivals: make([]atomic.Int64, n), completed: make([]atomic.Int64, n), orphaned: make([]atomic.Int64, n),
		conns: make([]atomic.Int64, n),
	}
}

// at is the slot of now, or -1 past the end (nothing is counted there).
func (c *counters) at(now time.Time) int {
	i := int(now.Sub(c.start) / slot)
	if now.Before(c.start) || i >= len(c.offered) {
		return -1
	}
	return i
}

func bump(s []atomic.Int64, i int) {
	if i >= 0 {
		s[i].Add(1)
	}
}

// fifoServer is a plain net/http server of the kind most services run:
// a fixed pool of workers in front of an unbounded FIFO queue, each
// request's work a timed wait (see work). A request whose caller has gone stays in
// the queue and is worked on all the same: nothing looks at its context
// before doing the work (the handler itself returns when its caller goes,
// so that connections are not held). The trigger multiplies the service
// time of the work started between slowFrom and slowTo.
type fifoServer struct {
	sc               scenario
	slowFrom, slowTo time.Time
	c                *counters

	jobs             chan job
	stop             chan struct{}
	wg               sync.WaitGroup
	queued, dequeued atomic.Int64
	lost             atomic.Int64 // worker time the machine took from a busy worker, in ns
}

type job struct {
	ctx  context.Context
	done chan struct{}
}

// newFIFOServer starts the workers; Close stops them, dropping what is
// still queued.
func newFIFOServer(sc scenario, c *counters) *fifoServer {
	s := &fifoServer{
		sc: sc, c: c,
		slowFrom: c.start.Add(sc.calm), slowTo: c.start.Add(sc.calm + sc.trigger),
		jobs: make(chan job, 1<<18), stop: make(chan struct{}),
	}
	for range sc.workers {
		s.wg.Go(s.work)
	}
	return s
}

// work is one worker. Each request's work starts when the worker is free
// and lasts the service time, on the worker's own schedule: a busy worker
// starts the next request where the last one was due to end, so that a
// late wake-up on a busy machine does not take capacity away (the server
// serves workers / service calls a second whenever it has a queue).
func (s *fifoServer) work() {
	free := time.Now()
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		// A request that was already waiting starts when the last one
		// was due to end (at most one service time ago: a machine that
		// stalls the worker for longer takes that time away); one the
		// worker waited for starts now.
		var j job
		start := free
		select {
		case j = <-s.jobs:
			if late := time.Now().Add(-s.sc.service); start.Before(late) {
				s.lost.Add(int64(late.Sub(start)))
				start = late
			}
		default:
			select {
			case <-s.stop:
				return
			case j = <-s.jobs:
			}
			start = time.Now()
		}
		s.dequeued.Add(1)
		d := s.sc.service
		if !start.Before(s.slowFrom) && start.Before(s.slowTo) {
			d *= time.Duration(s.sc.slowdown)
		}
		free = start.Add(d)
		time.Sleep(time.Until(free))
		i := s.c.at(time.Now())
		bump(s.c.completed, i)
		if j.ctx.Err() != nil {
			bump(s.c.orphaned, i)
		}
		close(j.done)
	}
}

func (s *fifoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	bump(s.c.arrivals, s.c.at(time.Now()))
	j := job{ctx: r.Context(), done: make(chan struct{})}
	s.queued.Add(1)
	s.jobs <- j
	select {
	case <-j.done:
		io.WriteString(w, "ok")
	case <-r.Context().Done():
	}
}

// queueLen is the number of requests waiting for a worker.
func (s *fifoServer) queueLen() int64 { return s.queued.Load() - s.dequeued.Load() }

func (s *fifoServer) Close() {
	close(s.stop)
	s.wg.Wait()
}

// caller makes one call on behalf of a user whose deadline is ctx's, and
// says whether it got a 200.
type caller func(ctx context.Context) bool

// metaClient is one client under test: new builds it over base, to call url.
type metaClient struct {
	name string
	new  func(tb testing.TB, base http.RoundTripper, url string) caller
}

// Backoff of the hand-written loop: 100 ms, doubled each retry, full jitter.
const loopBackoff = 100 * time.Millisecond

// metaClients are the clients of the experiment, each as its own docs (or
// common practice, for the loops) set it up for production.
var metaClients = []metaClient{
	// net/http alone: no retry. The caller's context carries the deadline.
	{"net-http", func(_ testing.TB, base http.RoundTripper, url string) caller {
		c := &http.Client{Transport: base}
		return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
	}},
	// The retry loop a service writes by hand: 3 attempts, 100 ms
	// backoff doubled each time with full jitter, retrying errors and 5xx,
	// the caller's context passed down (so it never retries past the
	// deadline).
	{"loop", func(_ testing.TB, base http.RoundTripper, url string) caller {
		c := &http.Client{Transport: base}
		var seq atomic.Uint64
		return func(ctx context.Context) bool { return retryLoop(ctx, ctx, c, url, seq.Add(1)) }
	}},
	// The same loop where the deadline is http.Client.Timeout, one second
	// per attempt, and the caller's context is not passed down: the loop
	// retries an attempt that timed out, after its caller has gone. Common
	// in code whose callers do not hand it a context.
	{"loop-per-attempt", func(_ testing.TB, base http.RoundTripper, url string) caller {
		c := &http.Client{Transport: base, Timeout: metastableRun.deadline}
		var seq atomic.Uint64
		return func(context.Context) bool {
			return retryLoop(context.Background(), context.Background(), c, url, seq.Add(1))
		}
	}},
	// go-retryablehttp's NewClient at its defaults (RetryMax 4, waits of
	// 1 s to 30 s, DefaultRetryPolicy), its logger off and its transport
	// the shared base, called with the caller's context.
	{"retryablehttp", func(_ testing.TB, base http.RoundTripper, url string) caller {
		rc := retryablehttp.NewClient()
		rc.Logger = nil
		rc.HTTPClient = &http.Client{Transport: base}
		c := &http.Client{Transport: &retryablehttp.RoundTripper{Client: rc}}
		return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
	}},
	// failsafehttp's retry policy as failsafe-go's HTTP docs build it:
	// NewRetryPolicyBuilder().Build() (3 attempts, no delay, retrying 429,
	// 5xx but 501 and transport errors).
	{"failsafe", func(_ testing.TB, base http.RoundTripper, url string) caller {
		c := &http.Client{Transport: failsafehttp.NewRoundTripper(base, failsafehttp.NewRetryPolicyBuilder().Build())}
		return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
	}},
	// The same with failsafe-go's budget.New() (at most 20% of the
	// executions in flight may be retries, and at least 3).
	{"failsafe-budget", func(_ testing.TB, base http.RoundTripper, url string) caller {
		rp := failsafehttp.NewRetryPolicyBuilder().WithBudget(budget.New()).Build()
		c := &http.Client{Transport: failsafehttp.NewRoundTripper(base, rp)}
		return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
	}},
	// README.md's quick start.
	{"resilix", func(tb testing.TB, base http.RoundTripper, url string) caller {
		c := &http.Client{Transport: mustResilix(tb, base, quickStart())}
		return func(ctx context.Context) bool { return get(ctx, c, url) == http.StatusOK }
	}},
}

// quickStart is the chain of README.md's quick start.
func quickStart() policy.Set {
	return policy.Set{
		Attempts:  3,
		Retry:     &policy.Retry{},
		Hedge:     &policy.Hedge{},
		Throttler: &policy.Throttler{},
		Breaker:   &policy.Breaker{},
		Limiter:   &policy.Limiter{},
		Timeout:   &policy.Timeout{PerAttempt: 2 * time.Second},
	}
}

func metaClientNamed(name string) metaClient {
	for _, m := range metaClients {
		if m.name == name {
			return m
		}
	}
	panic("no client " + name)
}

// get makes one GET and returns its status, 0 on an error; the body is
// read and closed.
func get(ctx context.Context, c *http.Client, url string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// retryLoop is the hand-written retry: up to 3 attempts on reqCtx, with
// backoff between them, retrying errors and 5xx, until the caller's
// waitCtx ends the waits (a loop given the caller's context stops there).
// The jitter comes from a source seeded with seed.
func retryLoop(waitCtx, reqCtx context.Context, c *http.Client, url string, seed uint64) bool {
	rnd := rand.New(rand.NewPCG(seed, 35))
	for attempt := range 3 {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(rnd.Int64N(int64(loopBackoff << (attempt - 1)))))
			select {
			case <-t.C:
			case <-waitCtx.Done():
				t.Stop()
				return false
			}
		}
		st := get(reqCtx, c, url)
		if st == http.StatusOK {
			return true
		}
		if st != 0 && st < 500 {
			return false
		}
		if waitCtx.Err() != nil {
			return false
		}
	}
	return false
}

// offer issues sc.rate calls a second through call, at fixed times from
// c.start whatever became of the earlier ones, each with the caller's
// deadline from the moment it is issued, and counts each in the slot it
// was issued in; it returns once every call has returned.
func offer(sc scenario, c *counters, call caller) {
	n := int(sc.total().Seconds() * float64(sc.rate))
	var wg sync.WaitGroup
	for i := range n {
		at := c.start.Add(time.Duration(i) * time.Second / time.Duration(sc.rate))
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		s := int(at.Sub(c.start) / slot)
		c.offered[s].Add(1)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), sc.deadline)
			defer cancel()
			dl, _ := ctx.Deadline()
			if call(ctx) && time.Now().Before(dl) {
				c.good[s].Add(1)
			}
		})
	}
	wg.Wait()
}

// sampleQueues records the sum of the servers' queues at the end of each
// slot until stop is closed.
func sampleQueues(c *counters, queue []int64, stop <-chan struct{}, servers ...*fifoServer) {
	t := time.NewTicker(slot)
	defer t.Stop()
	last := 0
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			// A busy machine delays ticks, and a ticker drops those its
			// receiver is late for: every slot since the last sample gets
			// this one.
			i := c.at(now)
			if i < 0 {
				i = len(queue)
				if now.Before(c.start) {
					continue
				}
			}
			var q int64
			for _, s := range servers {
				q += s.queueLen()
			}
			for ; last < i; last++ {
				queue[last] = q
			}
		}
	}
}

func (c *counters) series(queue []int64) *series {
	n := len(c.offered)
	s := newSeries(n)
	load := func(dst []int64, src []atomic.Int64) {
		for i := range src {
			dst[i] = src[i].Load()
		}
	}
	load(s.offered, c.offered)
	load(s.good, c.good)
	load(s.arrivals, c.arrivals)
	load(s.completed, c.completed)
	load(s.orphaned, c.orphaned)
	load(s.conns, c.conns)
	copy(s.queue, queue)
	return s
}

// outcome is one client's run, reduced.
type outcome struct {
	name    string
	s       *series
	sc      scenario
	servers int
}

func sum(s []int64, from, to int) int64 {
	var n int64
	for _, v := range s[max(from, 0):min(to, len(s))] {
		n += v
	}
	return n
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// goodput is the share of the calls issued in [from, to) slots that
// succeeded within their deadline.
func (o outcome) goodput(from, to int) float64 {
	return ratio(sum(o.s.good, from, to), sum(o.s.offered, from, to))
}

// work is the server's handler starts over the calls offered in [from, to).
func (o outcome) work(from, to int) float64 {
	return ratio(sum(o.s.arrivals, from, to), sum(o.s.offered, from, to))
}

// recovery is the time from the trigger's end to the first slot boundary
// from which two consecutive seconds each have a goodput of at least 95%
// of the calls offered in them, or -1 if there is none in the window.
func (o outcome) recovery() time.Duration {
	_, end := o.sc.triggerSlots()
	perSec := int(time.Second / slot)
	for t := end; t+2*perSec <= len(o.s.offered); t++ {
		if o.goodput(t, t+perSec) >= 0.95 && o.goodput(t+perSec, t+2*perSec) >= 0.95 {
			return time.Duration(t-end) * slot
		}
	}
	return -1
}

func (o outcome) peakQueue(from, to int) int64 {
	var m int64
	for _, v := range o.s.queue[from:to] {
		m = max(m, v)
	}
	return m
}

func fmtRecovery(d time.Duration) string {
	if d < 0 {
		return "not within the window"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// table is the outcomes as a Markdown table, one row per client.
func table(outs []outcome) string {
	var b strings.Builder
	b.WriteString("| client | goodput calm | goodput trigger | goodput last 5 s | back to 95% after | work/offered trigger | work/offered 5 s after | work for gone callers | peak queue | new conns/s after | server time lost |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, o := range outs {
		from, to := o.sc.triggerSlots()
		n := o.sc.slots()
		warm := int(time.Second / slot)
		five := int(5 * time.Second / slot)
		fmt.Fprintf(&b, "| %s | %.1f%% | %.1f%% | %.1f%% | %s | %.2f | %.2f | %.0f%% | %d | %.0f | %.1f%% |\n", o.name,
			100*o.goodput(warm, from), 100*o.goodput(from, to), 100*o.goodput(n-five, n), fmtRecovery(o.recovery()),
			o.work(from, to), o.work(to, to+five),
			100*ratio(sum(o.s.orphaned, 0, n), sum(o.s.completed, 0, n)), o.peakQueue(0, n),
			float64(sum(o.s.conns, to, n))/(o.sc.after.Seconds()),
			100*o.s.lost.Seconds()/(o.sc.total().Seconds()*float64(o.sc.workers*o.servers)))
	}
	return b.String()
}

// perSecond is an outcome second by second, for the log.
func perSecond(o outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, second by second (goodput %%, handler starts / offered, queue at the second's end):\n", o.name)
	perSec := int(time.Second / slot)
	for t := 0; t+perSec <= len(o.s.offered); t += perSec {
		fmt.Fprintf(&b, "  %2ds %5.1f%% %4.2f %6d\n", t/perSec, 100*o.goodput(t, t+perSec), o.work(t, t+perSec), o.s.queue[t+perSec-1])
	}
	return b.String()
}

// checkTargets reports what resilix misses of make metastable's targets:
// back to 95% goodput within 2 s of the trigger's end, and at most 1.3
// handler starts per offered call during the trigger.
func checkTargets(o outcome) []string {
	var miss []string
	if r := o.recovery(); r < 0 || r > 2*time.Second {
		miss = append(miss, fmt.Sprintf("%s: back to 95%% goodput after %s, target 2 s", o.name, fmtRecovery(r)))
	}
	from, to := o.sc.triggerSlots()
	if w := o.work(from, to); w > 1.3 {
		miss = append(miss, fmt.Sprintf("%s: %.2f handler starts per offered call during the trigger, target 1.3", o.name, w))
	}
	return miss
}
