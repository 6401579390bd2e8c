package benchmarks

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// loopCount is what a closed loop of callers counted.
type loopCount struct {
	ok, refused, other int64
	elapsed            time.Duration
}

func (c *loopCount) add(o loopCount) {
	c.ok += o.ok
	c.refused += o.refused
	c.other += o.other
	c.elapsed += o.elapsed
}

func (c loopCount) rate() float64 { return float64(c.ok) / c.elapsed.Seconds() }

func (c loopCount) refusedShare() float64 {
	return float64(c.refused) / float64(max(c.ok+c.refused+c.other, 1))
}

// closedLoop runs callers that call url through c back to back for d. A
// caller that is refused (refused(err)) waits pause before its next call,
// or calls again at once when pause is zero.
func closedLoop(c *http.Client, url string, callers int, d, pause time.Duration, refused func(error) bool) loopCount {
	var ok, ref, other atomic.Int64
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
				case refused != nil && refused(err):
					ref.Add(1)
					if pause > 0 {
						time.Sleep(pause)
					}
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return loopCount{ok: ok.Load(), refused: ref.Load(), other: other.Load(), elapsed: time.Since(start)}
}

// BenchmarkLimiterHealthyUpstream is resilix's benchmark of the same name
// with failsafe-go beside it: a loopback server whose handler answers at
// once, 16 closed-loop callers, bare net/http, resilix's limiter and
// failsafe-go's, each over its own *http.Transport to the same server. The
// three take turns in segments of 50 ms (bare, resilix, failsafe, then
// back: failsafe, resilix, bare), 20 segments each per iteration, so that
// the machine's other load hits all three alike. A refused caller waits 1
// ms before its next call, or calls again at once. For each limiter it
// reports its throughput over bare's, the share of its calls refused and
// its limit at the end, and logs a table row.
//
//	go test -run '^$' -bench LimiterHealthyUpstream -count 5
func BenchmarkLimiterHealthyUpstream(b *testing.B) {
	const (
		callers  = 16
		segment  = 50 * time.Millisecond
		segments = 20
	)
	for _, sc := range []struct {
		name  string
		pause time.Duration
	}{
		{"refused-waits-1ms", time.Millisecond},
		{"refused-retries-at-once", 0},
	} {
		b.Run(sc.name, func(b *testing.B) {
			srv := httptest.NewServer(httptestutil.NewUpstream(httptestutil.Options{}))
			defer srv.Close()
			host := strings.TrimPrefix(srv.URL, "http://")
			type client struct {
				name    string
				c       *http.Client
				refused func(error) bool
				limit   func() int
				run     loopCount
			}
			newBase := func() *http.Transport {
				t := &http.Transport{MaxIdleConnsPerHost: 2 * callers}
				b.Cleanup(t.CloseIdleConnections)
				return t
			}
			clients := []*client{{name: "net-http", c: &http.Client{Transport: newBase()}}}
			for _, p := range limiterPeers {
				rt, refused, limit := p.new(b, newBase(), host)
				clients = append(clients, &client{name: p.name, c: &http.Client{Transport: rt}, refused: refused, limit: limit})
			}
			for _, c := range clients { // warm up
				closedLoop(c.c, srv.URL, callers, 3*segment, sc.pause, c.refused)
			}
			for b.Loop() {
				for _, c := range clients {
					c.run = loopCount{}
				}
				for i := range segments {
					order := slices.Clone(clients)
					if i%2 == 1 {
						slices.Reverse(order)
					}
					for _, c := range order {
						c.run.add(closedLoop(c.c, srv.URL, callers, segment, sc.pause, c.refused))
					}
				}
				bare := clients[0].run
				b.ReportMetric(bare.rate(), "bare-req/s")
				for _, c := range clients[1:] {
					ratio := c.run.rate() / bare.rate()
					b.ReportMetric(ratio, c.name+"-ratio")
					b.ReportMetric(100*c.run.refusedShare(), c.name+"-refused-%")
					b.ReportMetric(float64(c.limit()), c.name+"-limit")
					b.Logf("| %s | %s | %.1fk req/s | %.1fk req/s (%.3f×) | %.3g%% | %d |", sc.name, c.name,
						bare.rate()/1000, c.run.rate()/1000, ratio, 100*c.run.refusedShare(), c.limit())
				}
				b.ReportMetric(0, "ns/op")
				for _, c := range clients {
					if c.run.other > 0 {
						b.Errorf("%s: %d calls failed other than by a refusal", c.name, c.run.other)
					}
				}
			}
		})
	}
}

// BenchmarkLimiterOverload is the overload a limiter is for, as resilix's
// BenchmarkLimiterQueueFactor sets it up: an upstream of 8 workers at 5 ms
// a call (1600 calls a second) that queues the rest, under an open-loop
// load of twice that for 2 s, after 500 calm calls to learn from. It
// reports the share shed, the calls served a second, the p50 and p99 of
// the served calls and the limit at the end. net-http is the same load
// with no limiter: everything queues at the upstream.
//
//	go test -run '^$' -bench LimiterOverload -count 5
func BenchmarkLimiterOverload(b *testing.B) {
	const (
		rate     = 3200
		duration = 2 * time.Second
	)
	peers := append([]limiterPeer{{"net-http", nil}}, limiterPeers...)
	for _, p := range peers {
		b.Run(p.name, func(b *testing.B) {
			up := httptestutil.NewUpstream(httptestutil.Options{
				Latency: httptestutil.Constant(5 * time.Millisecond), Capacity: 8, Queue: true,
			})
			srv := httptest.NewServer(up)
			defer srv.Close()
			base := &http.Transport{MaxIdleConnsPerHost: 256}
			defer base.CloseIdleConnections()
			var rt http.RoundTripper = base
			refused, limit := func(error) bool { return false }, func() int { return 0 }
			if p.new != nil {
				rt, refused, limit = p.new(b, base, strings.TrimPrefix(srv.URL, "http://"))
			}
			c := &http.Client{Transport: rt, Timeout: 10 * time.Second}
			httptestutil.Load{Calls: 500, Workers: 4}.Run(c, srv.URL)
			for b.Loop() {
				var (
					mu     sync.Mutex
					served []time.Duration
					shed   int
					other  int
					wg     sync.WaitGroup
				)
				start := time.Now()
				for i := range int(rate * duration.Seconds()) {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
					wg.Go(func() {
						t0 := time.Now()
						resp, err := c.Get(srv.URL)
						d := time.Since(t0)
						if err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil && resp.StatusCode == http.StatusOK:
							served = append(served, d)
						case err != nil && refused(err):
							shed++
						default:
							other++
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				slices.Sort(served)
				res := httptestutil.LoadResult{Latencies: served}
				total := len(served) + shed + other
				b.ReportMetric(100*float64(shed)/float64(total), "shed-%")
				b.ReportMetric(float64(len(served))/elapsed.Seconds(), "served/s")
				b.ReportMetric(ms(res.Quantile(0.5)), "p50-ms")
				b.ReportMetric(ms(res.Quantile(0.99)), "p99-ms")
				b.ReportMetric(float64(limit()), "limit")
				b.ReportMetric(0, "ns/op")
				b.Logf("| %s | %.1f%% | %.0f/s | %.1f ms | %.1f ms | %d |", p.name, 100*float64(shed)/float64(total),
					float64(len(served))/elapsed.Seconds(), ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), limit())
				if other > 0 {
					b.Errorf("%d calls failed other than by a refusal", other)
				}
			}
		})
	}
}
