package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/internal/fixedhedge"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// The loopback benchmarks measure what hedging does to the latency a
// caller sees, not nanoseconds of resilix: each iteration is a closed-loop
// load of calls against a local upstream, reported as p50/p99/p99.9 in
// milliseconds and extra wire calls in percent of calls. Run them with
//
//	go test -run '^$' -bench 'Hedging' -count 5 ./transport

const (
	loadCalls   = 2000
	loadWorkers = 8
)

func reportLoad(b *testing.B, res httptestutil.LoadResult, wire int64) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(res.Quantile(0.5)), "p50-ms")
	b.ReportMetric(ms(res.Quantile(0.99)), "p99-ms")
	b.ReportMetric(ms(res.Quantile(0.999)), "p99.9-ms")
	n := int64(len(res.Latencies))
	b.ReportMetric(100*float64(wire-n)/float64(n), "extra-%")
	b.ReportMetric(0, "ns/op") // one op is a whole load; its time says nothing
}

func hedgingClientWith(b *testing.B, h *policy.Hedge) *http.Client {
	base := &http.Transport{MaxIdleConnsPerHost: 2 * loadWorkers}
	b.Cleanup(base.CloseIdleConnections)
	tr := mustNew(b, Config{Base: base, Policies: policy.Set{Hedge: h}})
	return &http.Client{Transport: tr}
}

// hedgeProbe watches a hedging transport's calls, to say where the tail's
// milliseconds go: how late each hedge left after its threshold (the timer's
// lateness, and the hedging gates' work), how many hedges the budget
// refused, and, of the calls still slow after 100ms, how many were hedged
// (the hedge drew the slow mode too) and how many were not.
type hedgeProbe struct {
	rt http.RoundTripper

	mu                        sync.Mutex
	late                      []time.Duration
	refused                   int
	slowHedged, slowNotHedged int
}

type probeKey struct{}

type probeCall struct {
	start  time.Time
	hedged atomic.Bool
}

func (p *hedgeProbe) RoundTrip(r *http.Request) (*http.Response, error) {
	pc := &probeCall{start: time.Now()}
	resp, err := p.rt.RoundTrip(r.WithContext(context.WithValue(r.Context(), probeKey{}, pc)))
	if time.Since(pc.start) > 100*time.Millisecond {
		p.mu.Lock()
		if pc.hedged.Load() {
			p.slowHedged++
		} else {
			p.slowNotHedged++
		}
		p.mu.Unlock()
	}
	return resp, err
}

func (p *hedgeProbe) observer() *policy.Observer {
	return &policy.Observer{
		HedgeStarted: func(h policy.HedgeInfo) {
			if pc, ok := h.Context.Value(probeKey{}).(*probeCall); ok {
				pc.hedged.Store(true)
				p.mu.Lock()
				p.late = append(p.late, time.Since(pc.start)-h.Threshold)
				p.mu.Unlock()
			}
		},
		HedgeSuppressed: func(s policy.HedgeSuppression) {
			if s.Reason == policy.HedgeBudget {
				p.mu.Lock()
				p.refused++
				p.mu.Unlock()
			}
		},
	}
}

func (p *hedgeProbe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.late, p.refused, p.slowHedged, p.slowNotHedged = nil, 0, 0, 0
}

// report reports what the probe saw, and the threshold tr holds for key.
func (p *hedgeProbe) report(b *testing.B, tr *Transport, key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	slices.Sort(p.late)
	if n := len(p.late); n > 0 {
		b.ReportMetric(float64(p.late[n/2])/float64(time.Millisecond), "hedge-late-p50-ms")
	}
	b.ReportMetric(float64(tr.Measured(key).HedgeThreshold)/float64(time.Millisecond), "threshold-ms")
	b.ReportMetric(float64(p.refused), "budget-refused")
	b.ReportMetric(float64(p.slowHedged), "slow-twice")
	b.ReportMetric(float64(p.slowNotHedged), "slow-unhedged")
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// BenchmarkHedgingBimodal: 97% of calls take 4ms, 3% take 150ms. Without
// hedging p99 is the slow mode; hedging at p95 should cut it to about two
// fast calls for about 5% more wire calls. A slow call whose hedge is slow
// too (0.03 × 0.03 of calls, about 2 of the 2000; p99.9 is the second
// slowest call) gets a third leg one threshold after the second (the
// default MaxConcurrent, 3); with "2-legs" (MaxConcurrent 2) it stays at
// 150ms. The hedging clients also report what hedgeProbe saw: the hedges' lateness,
// the threshold, the budget's refusals, and why the calls still slow after
// 100ms were. "ideal-p95" is the reference: the least a hedge can do, a
// second copy after a fixed delay, the first answer taken and the other
// cancelled, with no estimator, budget, gate or pool (fixedhedge.Hedger),
// its delay the p95 of 2000 unhedged calls measured just before. What it
// gets is the limit "the threshold plus one fast call" sets on this
// machine.
func BenchmarkHedgingBimodal(b *testing.B) {
	for _, hc := range []struct {
		name  string
		hedge *policy.Hedge // nil: plain net/http
	}{
		{"net-http", nil},
		{"resilix-p95", &policy.Hedge{Quantile: 0.95}},
		{"resilix-p95-2-legs", &policy.Hedge{Quantile: 0.95, MaxConcurrent: 2}},
		{"ideal-p95", nil},
	} {
		b.Run(hc.name, func(b *testing.B) {
			up := httptestutil.NewUpstream(httptestutil.Options{
				Latency: httptestutil.Bimodal(4*time.Millisecond, 150*time.Millisecond, 0.03),
			})
			srv := httptest.NewServer(up)
			defer srv.Close()
			base := &http.Transport{MaxIdleConnsPerHost: 2 * loadWorkers}
			defer base.CloseIdleConnections()
			c := &http.Client{Transport: base}
			var (
				probe *hedgeProbe
				tr    *Transport
			)
			var ideal time.Duration
			if hc.name == "ideal-p95" {
				res := httptestutil.Load{Calls: loadCalls, Workers: loadWorkers}.Run(c, srv.URL) // learn
				ideal = res.Quantile(0.95)
				c = &http.Client{Transport: fixedhedge.Hedger{Base: base, Delay: ideal}}
			}
			if hc.hedge != nil {
				probe = &hedgeProbe{}
				tr = mustNew(b, Config{Base: base, Policies: policy.Set{Hedge: hc.hedge}, Observer: probe.observer()})
				probe.rt = tr
				c = &http.Client{Transport: probe}
				httptestutil.Load{Calls: 300, Workers: loadWorkers}.Run(c, srv.URL) // learn
			}
			for b.Loop() {
				up.ResetStats()
				if probe != nil {
					probe.reset()
				}
				res := httptestutil.Load{Calls: loadCalls, Workers: loadWorkers}.Run(c, srv.URL)
				reportLoad(b, res, up.Stats().Requests)
				if probe != nil {
					probe.report(b, tr, strings.TrimPrefix(srv.URL, "http://"))
				}
				if ideal > 0 {
					b.ReportMetric(float64(ideal)/float64(time.Millisecond), "threshold-ms")
				}
			}
		})
	}
}

// BenchmarkHedgingBrownout: the upstream was calm (4ms) and every call now
// takes 35-45ms. The measured load starts at the switch, so it includes the
// moment the quantile catches up; the extra wire calls should stay near
// 1 - q rather than every call being hedged against the calm threshold,
// with the default third leg ("resilix-p95") as with two ("2-legs").
func BenchmarkHedgingBrownout(b *testing.B) {
	for _, hc := range []struct {
		name  string
		hedge *policy.Hedge
	}{
		{"resilix-p95", &policy.Hedge{Quantile: 0.95}},
		{"resilix-p95-2-legs", &policy.Hedge{Quantile: 0.95, MaxConcurrent: 2}},
	} {
		b.Run(hc.name, func(b *testing.B) { hedgingBrownout(b, hedgingClientWith(b, hc.hedge)) })
	}
}

func hedgingBrownout(b *testing.B, c *http.Client) {
	for b.Loop() {
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(4 * time.Millisecond)})
		srv := httptest.NewServer(up)
		httptestutil.Load{Calls: 1000, Workers: loadWorkers}.Run(c, srv.URL) // calm
		up.SetLatency(httptestutil.Uniform(35*time.Millisecond, 45*time.Millisecond))
		up.ResetStats()
		res := httptestutil.Load{Calls: loadCalls, Workers: loadWorkers}.Run(c, srv.URL)
		reportLoad(b, res, up.Stats().Requests)
		srv.Close()
	}
}

// BenchmarkLimiterQueueFactor settles the seed's open question of the
// limiter's queue depth with a tail-latency measurement, not a shed rate: a
// fixed-capacity upstream (8 workers, 5ms a call: 1600 calls/s, queueing
// beyond) under an open-loop load of twice that, for each QueueFactor. In
// steady overload the share shed is fixed by the excess whatever the queue
// holds; what the queue decides is how long the admitted calls wait. It
// reports the p50 and p99 of the admitted calls and the share shed.
//
//	go test -run '^$' -bench LimiterQueueFactor -count 5 ./transport
func BenchmarkLimiterQueueFactor(b *testing.B) {
	const (
		rate     = 3200 // calls a second, twice the upstream's capacity
		duration = 2 * time.Second
	)
	for _, qf := range []float64{0.5, 1, 2} {
		b.Run(fmt.Sprintf("QueueFactor=%v", qf), func(b *testing.B) {
			up := httptestutil.NewUpstream(httptestutil.Options{
				Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
			})
			srv := httptest.NewServer(up)
			defer srv.Close()
			base := &http.Transport{MaxIdleConnsPerHost: 256}
			defer base.CloseIdleConnections()
			tr := mustNew(b, Config{Base: base, Policies: policy.Set{Limiter: &policy.Limiter{QueueFactor: qf}}})
			c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
			httptestutil.Load{Calls: 500, Workers: 4}.Run(c, srv.URL) // learn the calm latency
			for b.Loop() {
				var (
					mu       sync.Mutex
					admitted []time.Duration
					shed     int
					wg       sync.WaitGroup
				)
				start := time.Now()
				for i := range int(rate * duration.Seconds()) {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
					wg.Go(func() {
						t0 := time.Now()
						resp, err := c.Get(srv.URL)
						d := time.Since(t0)
						if err == nil {
							resp.Body.Close()
						}
						mu.Lock()
						defer mu.Unlock()
						if err == nil {
							admitted = append(admitted, d)
						} else {
							shed++
						}
					})
				}
				wg.Wait()
				slices.Sort(admitted)
				res := httptestutil.LoadResult{Latencies: admitted}
				b.ReportMetric(float64(res.Quantile(0.5))/float64(time.Millisecond), "p50-ms")
				b.ReportMetric(float64(res.Quantile(0.99))/float64(time.Millisecond), "p99-ms")
				b.ReportMetric(100*float64(shed)/float64(shed+len(admitted)), "shed-%")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}

// BenchmarkCriticalUnderABulkFlood is TestCriticalSurvivesABulkFlood over
// loopback, where the latency the limiter learns from is a real one:
// sockets, net/http's connection pool and the scheduler included. 4
// Critical callers and 48 Bulk ones run for 2s against a fixed-capacity
// upstream (8 workers, 5ms a call, queueing beyond that). It reports
// Critical's availability and the share of Bulk that was shed; one op is a
// whole flood.
//
//	go test -run '^$' -bench CriticalUnderABulkFlood ./transport
func BenchmarkCriticalUnderABulkFlood(b *testing.B) {
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
	})
	srv := httptest.NewServer(up)
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	defer base.CloseIdleConnections()
	calm := func(ctx context.Context) context.Context { return ctx }
	bulk := func(ctx context.Context) context.Context { return shedding.WithPriority(ctx, shedding.Bulk) }
	for b.Loop() {
		tr := mustNew(b, Config{Base: base, Policies: policy.Set{Limiter: &policy.Limiter{}}})
		c := &http.Client{Transport: tr}
		var warmup, critical, flooded tally
		var wg sync.WaitGroup
		flood(&wg, c, srv.URL, 4, time.Now().Add(300*time.Millisecond), calm, &warmup)
		wg.Wait()
		stop := time.Now().Add(2 * time.Second)
		flood(&wg, c, srv.URL, 4, stop, calm, &critical)
		flood(&wg, c, srv.URL, 48, stop, bulk, &flooded)
		wg.Wait()
		b.ReportMetric(100*critical.availability(), "critical-ok-%")
		b.ReportMetric(100*float64(flooded.shed.Load())/float64(max(flooded.total(), 1)), "bulk-shed-%")
		b.ReportMetric(0, "ns/op")
		// Far below what the test asserts in virtual time: a loaded
		// machine's stalls reach the limiter as latency.
		if a := critical.availability(); a < 0.9 {
			b.Errorf("Critical availability %.3f under a Bulk flood", a)
		}
	}
}

// BenchmarkLimiterHealthyUpstream is the limiter in front of an upstream
// that is never overloaded: a loopback server whose handler answers at once
// (or after 2 ms, where the client's own CPU is a small part of the
// latency), 16 closed-loop callers, bare net/http against policy.Set{Limiter:
// &policy.Limiter{}}, each over its own *http.Transport to the same server.
// The two alternate in segments of 100 ms (bare, resilix, resilix, bare,
// ...), ten of each per iteration, so that whatever else loads the machine
// loads both alike. A refused caller either waits 1 ms before its next call
// or calls again at once. It reports both throughputs, their ratio, the
// share of resilix's calls that were refused, the limit at the end and the
// lowest it went during the iteration, and logs the same as a table row:
//
//	go test -run '^$' -bench LimiterHealthyUpstream -count 5 ./transport
func BenchmarkLimiterHealthyUpstream(b *testing.B) {
	const (
		callers  = 16
		segment  = 50 * time.Millisecond
		segments = 20 // of each client per iteration
	)
	for _, handler := range []time.Duration{0, 2 * time.Millisecond} {
		for _, sc := range []struct {
			name    string
			pause   time.Duration // after a refusal
			control bool          // bare against bare: the method's own spread
		}{
			{"refused-waits-1ms", time.Millisecond, false},
			{"refused-retries-at-once", 0, false},
			{"control-bare-vs-bare", 0, true},
		} {
			if sc.control && handler != 0 {
				continue
			}
			b.Run(fmt.Sprintf("handler=%v/%s", handler, sc.name), func(b *testing.B) {
				srv := httptest.NewServer(httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(handler)}))
				defer srv.Close()
				bareBase := &http.Transport{MaxIdleConnsPerHost: 2 * callers}
				defer bareBase.CloseIdleConnections()
				base := &http.Transport{MaxIdleConnsPerHost: 2 * callers}
				defer base.CloseIdleConnections()
				var mu sync.Mutex
				lowest := 0
				obs := &policy.Observer{LimitTransition: func(lt policy.LimitTransition) {
					mu.Lock()
					defer mu.Unlock()
					if lowest == 0 || lt.To < lowest {
						lowest = lt.To
					}
				}}
				tr := mustNew(b, Config{Base: base, Policies: policy.Set{Limiter: &policy.Limiter{}}, Observer: obs})
				bare, lim := &http.Client{Transport: bareBase}, &http.Client{Transport: tr}
				if sc.control {
					lim = &http.Client{Transport: base}
				}
				key := strings.TrimPrefix(srv.URL, "http://")
				closedLoop(bare, srv.URL, callers, 3*segment, sc.pause) // warm up both
				closedLoop(lim, srv.URL, callers, 3*segment, sc.pause)
				for b.Loop() {
					mu.Lock()
					lowest = tr.Measured(key).LimiterLimit
					mu.Unlock()
					var bareRun, limRun loopResult
					for i := range 2 * segments {
						if (i%2 == 0) == (i/2%2 == 0) {
							bareRun.add(closedLoop(bare, srv.URL, callers, segment, sc.pause))
						} else {
							limRun.add(closedLoop(lim, srv.URL, callers, segment, sc.pause))
						}
					}
					limit := tr.Measured(key).LimiterLimit
					mu.Lock()
					low := lowest
					mu.Unlock()
					ratio := limRun.rate() / bareRun.rate()
					b.ReportMetric(bareRun.rate(), "bare-req/s")
					b.ReportMetric(limRun.rate(), "resilix-req/s")
					b.ReportMetric(ratio, "ratio")
					b.ReportMetric(100*limRun.refusedShare(), "refused-%")
					b.ReportMetric(float64(limit), "limit")
					b.ReportMetric(float64(low), "lowest-limit")
					b.ReportMetric(0, "ns/op")
					b.Logf("| %v | %s | %.1fk req/s | %.1fk req/s (%.3f×) | %.3g%% | %d (lowest %d) |", handler, sc.name,
						bareRun.rate()/1000, limRun.rate()/1000, ratio, 100*limRun.refusedShare(), limit, low)
					if bareRun.other+limRun.other > 0 {
						b.Errorf("%d bare and %d resilix calls failed", bareRun.other, limRun.other)
					}
				}
			})
		}
	}
}

// loopResult is what closedLoop counted.
type loopResult struct {
	ok, refused, other int64
	elapsed            time.Duration
}

func (r *loopResult) add(o loopResult) {
	r.ok += o.ok
	r.refused += o.refused
	r.other += o.other
	r.elapsed += o.elapsed
}

// rate is the calls answered per second.
func (r loopResult) rate() float64 { return float64(r.ok) / r.elapsed.Seconds() }

// refusedShare is the share of calls refused by a gate.
func (r loopResult) refusedShare() float64 {
	return float64(r.refused) / float64(max(r.ok+r.refused+r.other, 1))
}

// closedLoop runs callers that each call url through c back to back for d.
// A caller that is refused waits pause (none when zero) before its next
// call.
func closedLoop(c *http.Client, url string, callers int, d time.Duration, pause time.Duration) loopResult {
	return sampledLoop(c, url, callers, d, pause, 0, nil)
}

// sampledLoop is closedLoop calling read every sample meanwhile, when
// read is not nil.
func sampledLoop(c *http.Client, url string, callers int, d, pause, sample time.Duration, read func()) loopResult {
	var ok, refused, other atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				resp, err := c.Get(url)
				switch {
				case err == nil:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						ok.Add(1)
					} else {
						other.Add(1)
					}
				case errors.Is(err, policy.ErrRejected):
					refused.Add(1)
					if pause > 0 {
						time.Sleep(pause)
					}
				default:
					other.Add(1)
				}
			}
		})
	}
	if read != nil {
		tick := time.NewTicker(sample)
		for now := range tick.C {
			if !now.Before(stop) {
				break
			}
			read()
		}
		tick.Stop()
	}
	wg.Wait()
	return loopResult{ok: ok.Load(), refused: refused.Load(), other: other.Load(), elapsed: time.Since(start)}
}

// BenchmarkThroughput is what resilix costs in calls a second on loopback:
// a handler that answers at once, 16 closed-loop callers, bare net/http
// against resilix with one policy on, or every policy, each client over
// its own *http.Transport to the same server. The two alternate in
// segments of 50 ms (bare, resilix, resilix, bare, ...), twenty of each
// per iteration, so that whatever else loads the machine loads both alike.
// It reports both throughputs and their ratio, the wire calls beyond one a
// call (hedges and retries), the connections each client dialled per
// thousand calls, and the process's CPU time per call during each client's
// segments (client and server together; see cpuTime); and logs the same as
// a table row. The cases named h2c- run the same over HTTP/2 without TLS
// (prior knowledge), where a cancelled request resets its stream and
// keeps the connection, which over HTTP/1.1 it closes. Four cases are
// not resilix but references, on the same footing (the same turns, the
// same kind of pool): cancellable is net/http with a cancellable context
// per call (see ownContext), the floor of Timeout and Hedge; goroutine
// is net/http with each call sent from a goroutine of its own (see
// onGoroutine), the least a hedger pays to keep its first leg off the
// caller's goroutine; redial-1% is net/http closing the connection after
// one call in a hundred (see redial), what ten dials and teardowns per
// thousand calls cost; and deadline is net/http under
// context.WithTimeout of a second per call (see ownContext), what a caller
// who sets its own per-call deadline pays, against which Timeout's second
// per attempt is measured:
//
//	go test -run '^$' -bench Throughput -count 10 ./transport
func BenchmarkThroughput(b *testing.B) {
	const (
		callers  = 16
		segment  = 50 * time.Millisecond
		segments = 20 // of each client per iteration
	)
	for _, pc := range []struct {
		name string
		set  policy.Set
		h2c  bool
	}{
		{"cancellable", policy.Set{}, false},
		{"deadline", policy.Set{}, false},
		{"goroutine", policy.Set{}, false},
		{"redial-1%", policy.Set{}, false},
		{"none", policy.Set{}, false},
		{"Retry", policy.Set{Retry: &policy.Retry{}}, false},
		{"Hedge", policy.Set{Hedge: &policy.Hedge{}}, false},
		{"Throttler", policy.Set{Throttler: &policy.Throttler{}}, false},
		{"Breaker", policy.Set{Breaker: &policy.Breaker{}}, false},
		{"Limiter", policy.Set{Limiter: &policy.Limiter{}}, false},
		{"Bulkhead", policy.Set{Bulkhead: &policy.Bulkhead{MaxConcurrent: 4 * callers}}, false},
		{"RateLimit", policy.Set{RateLimit: &policy.RateLimit{PerSecond: 1e9}}, false},
		{"Timeout", policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}, false},
		{"all", fullSet(), false},
		{"h2c-cancellable", policy.Set{}, true},
		{"h2c-none", policy.Set{}, true},
		{"h2c-Hedge", policy.Set{Hedge: &policy.Hedge{}}, true},
		{"h2c-Timeout", policy.Set{Timeout: &policy.Timeout{PerAttempt: time.Second}}, true},
		{"h2c-all", fullSet(), true},
	} {
		b.Run(pc.name, func(b *testing.B) {
			var served atomic.Int64
			up := httptestutil.NewUpstream(httptestutil.Options{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				up.ServeHTTP(w, r)
			}))
			if pc.h2c {
				srv.Config.Protocols = new(http.Protocols)
				srv.Config.Protocols.SetUnencryptedHTTP2(true)
			}
			srv.Start()
			defer srv.Close()
			var bareDials, dials atomic.Int64
			bareBase, base := dialCounting(2*callers, &bareDials), dialCounting(2*callers, &dials)
			if pc.h2c {
				for _, t := range []*http.Transport{bareBase, base} {
					t.Protocols = new(http.Protocols)
					t.Protocols.SetUnencryptedHTTP2(true)
				}
			}
			defer bareBase.CloseIdleConnections()
			defer base.CloseIdleConnections()
			bare, res := &http.Client{Transport: bareBase}, &http.Client{Transport: mustNew(b, Config{Base: base, Policies: pc.set})}
			closedLoop(bare, srv.URL, callers, 3*segment, 0) // warm up both, and teach resilix the latency
			closedLoop(res, srv.URL, callers, 3*segment, 0)
			switch {
			case strings.HasSuffix(pc.name, "cancellable"):
				res.Transport = ownContext{base, 0}
			case pc.name == "deadline":
				res.Transport = ownContext{base, time.Second}
			case pc.name == "goroutine":
				res.Transport = onGoroutine{base}
			case pc.name == "redial-1%":
				res.Transport = &redial{base: base, every: 100}
			}
			for b.Loop() {
				var bareRun, resRun loopResult
				var bareWire, resWire int64
				var bareCPU, resCPU time.Duration
				bareDials.Store(0)
				dials.Store(0)
				for i := range 2 * segments {
					before, cpu := served.Load(), cpuTime()
					if (i%2 == 0) == (i/2%2 == 0) {
						bareRun.add(closedLoop(bare, srv.URL, callers, segment, 0))
						bareWire += served.Load() - before
						bareCPU += cpuTime() - cpu
					} else {
						resRun.add(closedLoop(res, srv.URL, callers, segment, 0))
						resWire += served.Load() - before
						resCPU += cpuTime() - cpu
					}
				}
				ratio := resRun.rate() / bareRun.rate()
				extra := 100 * (float64(resWire)/float64(max(resRun.ok, 1)) - 1)
				perK := func(n int64, calls int64) float64 { return 1000 * float64(n) / float64(max(calls, 1)) }
				b.ReportMetric(bareRun.rate(), "bare-req/s")
				b.ReportMetric(resRun.rate(), "resilix-req/s")
				b.ReportMetric(ratio, "ratio")
				b.ReportMetric(extra, "extra-%")
				b.ReportMetric(perK(bareDials.Load(), bareWire), "bare-dials/k")
				b.ReportMetric(perK(dials.Load(), resWire), "resilix-dials/k")
				if bareCPU > 0 {
					b.ReportMetric(float64(bareCPU.Microseconds())/float64(max(bareRun.ok, 1)), "bare-cpu-µs/call")
					b.ReportMetric(float64(resCPU.Microseconds())/float64(max(resRun.ok, 1)), "resilix-cpu-µs/call")
				}
				b.ReportMetric(0, "ns/op")
				b.Logf("| %s | %.1fk req/s | %.1fk req/s (%.3f×) | %+.2f%% | %.2f / %.2f dials per 1000 calls |", pc.name,
					bareRun.rate()/1000, resRun.rate()/1000, ratio, extra, perK(bareDials.Load(), bareWire), perK(dials.Load(), resWire))
				if bareRun.other+resRun.other+resRun.refused > 0 {
					b.Errorf("%d bare and %d resilix calls failed, %d refused", bareRun.other, resRun.other, resRun.refused)
				}
			}
		})
	}
}

// ownContext is BenchmarkThroughput's reference for what a context costs
// net/http: plain net/http, each call under a context of its own,
// cancelled as the body is closed; with a timeout, made by
// context.WithTimeout, as by a caller that bounds its calls itself. A
// cancellable context (no timeout) is the least any per-attempt timeout or
// hedge leg over net/http can cost, since cutting an attempt short takes
// a context net/http watches.
type ownContext struct {
	base    http.RoundTripper
	timeout time.Duration // none when zero: context.WithCancel
}

func (c ownContext) RoundTrip(r *http.Request) (*http.Response, error) {
	var ctx context.Context
	var cancel context.CancelFunc
	if c.timeout > 0 {
		ctx, cancel = context.WithTimeout(r.Context(), c.timeout)
	} else {
		ctx, cancel = context.WithCancel(r.Context())
	}
	resp, err := c.base.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// onGoroutine is BenchmarkThroughput's reference for a first leg sent off
// the caller's goroutine: plain net/http, each call's RoundTrip on a
// goroutine of its own while the caller waits for its answer.
type onGoroutine struct{ base http.RoundTripper }

func (c onGoroutine) RoundTrip(r *http.Request) (*http.Response, error) {
	type answer struct {
		resp *http.Response
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		resp, err := c.base.RoundTrip(r)
		ch <- answer{resp, err}
	}()
	a := <-ch
	return a.resp, a.err
}

// redial is BenchmarkThroughput's reference for what a dial costs: plain
// net/http that closes the connection after one call in every, so that
// the next call on it dials a new one.
type redial struct {
	base  http.RoundTripper
	every int64
	n     atomic.Int64
}

func (c *redial) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.n.Add(1)%c.every == 0 {
		r = r.Clone(r.Context())
		r.Close = true
	}
	return c.base.RoundTrip(r)
}

// dialCounting is a connection pool of at most idle idle connections a
// host that counts the connections it dials in n.
func dialCounting(idle int, n *atomic.Int64) *http.Transport {
	d := &net.Dialer{}
	return &http.Transport{
		MaxIdleConnsPerHost: idle,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			n.Add(1)
			return d.DialContext(ctx, network, addr)
		},
	}
}
