package transport

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
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

func hedgingClient(b *testing.B) *http.Client {
	base := &http.Transport{MaxIdleConnsPerHost: 2 * loadWorkers}
	b.Cleanup(base.CloseIdleConnections)
	tr := mustNew(b, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{Quantile: 0.95}}})
	return &http.Client{Transport: tr}
}

// BenchmarkHedgingBimodal: 97% of calls take 4ms, 3% take 150ms. Without
// hedging p99 is the slow mode; hedging at p95 should cut it to about two
// fast calls for about 5% more wire calls.
func BenchmarkHedgingBimodal(b *testing.B) {
	for _, hedge := range []bool{false, true} {
		name := "net-http"
		if hedge {
			name = "resilix-p95"
		}
		b.Run(name, func(b *testing.B) {
			up := httptestutil.NewUpstream(httptestutil.Options{
				Latency: httptestutil.Bimodal(4*time.Millisecond, 150*time.Millisecond, 0.03),
			})
			srv := httptest.NewServer(up)
			defer srv.Close()
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * loadWorkers}}
			if hedge {
				c = hedgingClient(b)
				httptestutil.Load{Calls: 300, Workers: loadWorkers}.Run(c, srv.URL) // learn
			}
			defer c.CloseIdleConnections()
			for b.Loop() {
				up.ResetStats()
				res := httptestutil.Load{Calls: loadCalls, Workers: loadWorkers}.Run(c, srv.URL)
				reportLoad(b, res, up.Stats().Requests)
			}
		})
	}
}

// BenchmarkHedgingBrownout: the upstream was calm (4ms) and every call now
// takes 35-45ms. The measured load starts at the switch, so it includes the
// moment the quantile catches up; the extra wire calls should stay near
// 1 - q rather than every call being hedged against the calm threshold.
func BenchmarkHedgingBrownout(b *testing.B) {
	c := hedgingClient(b)
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
