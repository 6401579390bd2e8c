package admission

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
)

// The flash crowd: a server calm under a few callers meets a step to
// hundreds of them, each calling again as soon as it has its answer, or
// crowdPause after a refusal.
const (
	crowdWork  = 50 * time.Millisecond // the handler's time per request
	crowdPause = 50 * time.Millisecond // a refused caller comes back after it
	crowdCalm  = 10                    // callers before the step
	crowdSize  = 400                   // callers after it
	crowdWarm  = time.Second           // the calm before the step
	crowdRun   = 2 * time.Second       // the crowd, from the step
	crowdSlot  = 250 * time.Millisecond
)

// crowdTally counts one class of callers' requests by the slot of
// crowdSlot, counted from the step, in which each was sent.
type crowdTally struct {
	ok, refused, other [crowdRun / crowdSlot]atomic.Int64
}

func (c *crowdTally) add(sent time.Duration, status int) {
	if sent < 0 || sent >= crowdRun {
		return
	}
	i := sent / crowdSlot
	switch status {
	case http.StatusOK:
		c.ok[i].Add(1)
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		c.refused[i].Add(1)
	default:
		c.other[i].Add(1)
	}
}

// merge adds o's counts to c's.
func (c *crowdTally) merge(o *crowdTally) {
	for i := range c.ok {
		c.ok[i].Add(o.ok[i].Load())
		c.refused[i].Add(o.refused[i].Load())
		c.other[i].Add(o.other[i].Load())
	}
}

// admitted returns the share of the requests sent in [from, to) that were
// answered 200, and how many were sent.
func (c *crowdTally) admitted(from, to time.Duration) (float64, int64) {
	var ok, all int64
	for i := from / crowdSlot; i < to/crowdSlot; i++ {
		ok += c.ok[i].Load()
		all += c.ok[i].Load() + c.refused[i].Load() + c.other[i].Load()
	}
	return float64(ok) / float64(max(all, 1)), all
}

// others returns the answers that were neither 200 nor a refusal.
func (c *crowdTally) others() int64 {
	var n int64
	for i := range c.other {
		n += c.other[i].Load()
	}
	return n
}

// slots renders the admitted share of each slot.
func (c *crowdTally) slots() string {
	var b strings.Builder
	for i := range c.ok {
		a, n := c.admitted(time.Duration(i)*crowdSlot, time.Duration(i+1)*crowdSlot)
		fmt.Fprintf(&b, " %.3f(%d)", a, n)
	}
	return b.String()
}

// crowdGroup is a number of callers of one priority, from the start (calm)
// or from the step.
type crowdGroup struct {
	callers int
	calm    bool // from the start; otherwise from the step
	prio    string
	tally   *crowdTally
}

// runCrowd runs groups against url through c: the calm groups from now,
// the others from crowdWarm later (the step), all until crowdRun after the
// step. A request's context ends 5 s after it is sent. It returns when
// every caller has returned.
func runCrowd(c *http.Client, url string, groups ...crowdGroup) {
	start := time.Now()
	step := start.Add(crowdWarm)
	stop := step.Add(crowdRun)
	var wg sync.WaitGroup
	call := func(g crowdGroup) {
		for sent := time.Now(); sent.Before(stop); sent = time.Now() {
			status := crowdCall(c, url, g.prio)
			g.tally.add(sent.Sub(step), status)
			if status != http.StatusOK {
				time.Sleep(crowdPause)
			}
		}
	}
	for _, g := range groups {
		if g.calm {
			for range g.callers {
				wg.Go(func() { call(g) })
			}
		}
	}
	time.Sleep(time.Until(step))
	for _, g := range groups {
		if !g.calm {
			for range g.callers {
				wg.Go(func() { call(g) })
			}
		}
	}
	wg.Wait()
}

// crowdCall sends one request of priority prio and returns its status, or
// 0 for an error.
func crowdCall(c *http.Client, url, prio string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Resilix-Priority", prio)
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// crowdServer is a handler that takes crowdWork a request, with room for
// every request (capacity 0) or a fixed capacity, beyond which requests
// wait their turn, behind admission with its defaults, trusting every
// caller's priority and reporting to e.
func crowdServer(t testing.TB, capacity int, e *events) *server {
	return crowdServerWith(t, capacity, e, policy.Limiter{})
}

// crowdServerWith is crowdServer with the limiter configured by lim.
func crowdServerWith(t testing.TB, capacity int, e *events, lim policy.Limiter) *server {
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Constant(crowdWork), Capacity: capacity, Queue: capacity > 0,
	})
	return mustHandler(t, up, Config{Trust: trustAll, Observer: e.observer(), Limiter: lim})
}

// trace renders the first n limit moves e heard.
func (e *events) trace(n int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for i, l := range e.limits {
		if i == n {
			b.WriteString(" ...")
			break
		}
		if i == 0 {
			fmt.Fprint(&b, l.From)
		}
		fmt.Fprint(&b, " ", l.To)
	}
	return b.String()
}

// highest returns the highest limit e heard of.
func (e *events) highest() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	hi := 0
	for _, l := range e.limits {
		hi = max(hi, l.From, l.To)
	}
	return hi
}

// checkRoomyCrowd checks a flash crowd on a handler with room for it: at
// least 80% of the requests sent over the first 2 s admitted, and 99% of
// those sent over the second second.
func checkRoomyCrowd(t *testing.T, crowd *crowdTally, limit int) {
	t.Helper()
	first, n := crowd.admitted(0, 2*time.Second)
	second, m := crowd.admitted(time.Second, 2*time.Second)
	t.Logf("admitted %.3f of %d over the first 2 s, %.4f of %d over the second second; limit %d; by %v:%s",
		first, n, second, m, limit, crowdSlot, crowd.slots())
	if first < 0.80 {
		t.Errorf("%.3f of the requests over the first 2 s admitted, want >= 0.80", first)
	}
	if second < 0.99 {
		t.Errorf("%.4f of the requests over the second second admitted, want >= 0.99", second)
	}
	if o := crowd.others(); o > 0 {
		t.Errorf("%d answers neither 200 nor a refusal", o)
	}
}

// TestFlashCrowdIsAdmitted: 10 callers of a handler that takes 50 ms and
// has room for any number of requests, then a step to 400. The limit
// starts at 20 (and the calm grows it a little); the server could serve
// the crowd at once, and the limiter's slow start must find that within a
// few round trips: it doubles the limit each round trip that calls wait or
// are refused for lack of it while the latency holds.
func TestFlashCrowdIsAdmitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		crowd, e, h := roomyCrowd(t, policy.Limiter{})
		t.Logf("limit %s", e.trace(16))
		checkRoomyCrowd(t, crowd, h.limiter.Limit())
	})
}

// roomyCrowd runs TestFlashCrowdIsAdmitted's crowd, the calm callers
// counted among it, against a handler whose limiter is configured by lim,
// inside the caller's bubble.
func roomyCrowd(t *testing.T, lim policy.Limiter) (*crowdTally, *events, *server) {
	e := new(events)
	h := crowdServerWith(t, 0, e, lim)
	crowd := runRoomy(&http.Client{Transport: httptestutil.InMemory(h)}, "http://svc.test/")
	synctest.Wait()
	return crowd, e, h
}

// runRoomy runs the crowd of TestFlashCrowdIsAdmitted against url, all of
// it Critical, and returns its tally, the calm callers counted among it.
func runRoomy(c *http.Client, url string) *crowdTally {
	var calm, crowd crowdTally
	runCrowd(c, url,
		crowdGroup{callers: crowdCalm, calm: true, prio: "critical", tally: &calm},
		crowdGroup{callers: crowdSize - crowdCalm, prio: "critical", tally: &crowd},
	)
	crowd.merge(&calm) // the calm callers are part of the crowd
	return &crowd
}

// runFixed runs the crowd of TestFlashCrowdOnAFixedCapacity against url:
// the calm callers Critical, the newcomers Bulk.
func runFixed(c *http.Client, url string) (critical, bulk *crowdTally) {
	critical, bulk = new(crowdTally), new(crowdTally)
	runCrowd(c, url,
		crowdGroup{callers: crowdCalm, calm: true, prio: "critical", tally: critical},
		crowdGroup{callers: crowdSize - crowdCalm, prio: "bulk", tally: bulk},
	)
	return critical, bulk
}

// TestFlashCrowdWithoutSlowStart is the control of TestFlashCrowdIsAdmitted:
// the same crowd with slow start off (SlowStartIdle < 0), where the limit
// grows by sqrt(limit) a round, is refused for most of its first second.
// It is slow start, not the crowd's shape, that admits it.
func TestFlashCrowdWithoutSlowStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		crowd, e, _ := roomyCrowd(t, policy.Limiter{SlowStartIdle: -1})
		first, n := crowd.admitted(0, 2*time.Second)
		second, m := crowd.admitted(time.Second, 2*time.Second)
		t.Logf("slow start off: admitted %.3f of %d over the first 2 s, %.4f of %d over the second second; limit %s",
			first, n, second, m, e.trace(16))
		if first >= 0.80 {
			t.Errorf("%.3f of the requests over the first 2 s admitted without slow start, want < 0.80 (the control no longer tells slow start's effect)", first)
		}
	})
}

// checkFixedCrowd checks a Bulk flash crowd on a handler of a fixed
// capacity beside the calm Critical callers: Critical keeps at least 99% of
// its requests, Bulk is refused for most of its requests once the limit has
// found the capacity, mostly with 429s (shed by priority), the limit never
// passes 2.5 times the capacity (slow start's doubling is judged on the
// calls admitted under the doubled limit), and it ends near the capacity.
func checkFixedCrowd(t *testing.T, critical, bulk *crowdTally, capacity, limit, highest int) {
	t.Helper()
	if 2*highest > 5*capacity {
		t.Errorf("limit up to %d on a capacity of %d, want <= %.0f", highest, capacity, 2.5*float64(capacity))
	}
	crit, n := critical.admitted(0, crowdRun)
	b, m := bulk.admitted(time.Second, crowdRun)
	t.Logf("Critical %.4f of %d admitted; Bulk %.3f of %d over the second second (by %v:%s); limit %d",
		crit, n, b, m, crowdSlot, bulk.slots(), limit)
	if crit < 0.99 {
		t.Errorf("Critical %.4f of %d admitted, want >= 0.99", crit, n)
	}
	// The capacity serves capacity/crowdWork requests a second; Bulk
	// sends about 390/(crowdPause) when refused.
	if b > 0.2 {
		t.Errorf("Bulk %.3f of its requests admitted over the second second, want most refused", b)
	}
	if limit > 3*capacity {
		t.Errorf("limit %d at the end on a capacity of %d, want <= %d", limit, capacity, 3*capacity)
	}
	if o := critical.others() + bulk.others(); o > 0 {
		t.Errorf("%d answers neither 200 nor a refusal", o)
	}
}

// TestFlashCrowdOnAFixedCapacity: the same step, of Bulk callers, on a
// handler of a fixed capacity of 20 (the calm 10 Critical callers use half
// of it), which queues what it cannot serve: the latency rises as soon as
// the limit passes 20. Slow start ends there, and the limiter sheds as
// under any flood: Bulk first, so that Critical keeps its requests.
func TestFlashCrowdOnAFixedCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const capacity = 20
		var e events
		h := crowdServer(t, capacity, &e)
		critical, bulk := runFixed(&http.Client{Transport: httptestutil.InMemory(h)}, "http://svc.test/")
		synctest.Wait()
		t.Logf("limit %s", e.trace(16))
		checkFixedCrowd(t, critical, bulk, capacity, h.limiter.Limit(), e.highest())
	})
}
