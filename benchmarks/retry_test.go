package benchmarks

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// BenchmarkRetryDeadUpstream measures the amplification each library's
// retry puts on a dependency that is already failing: an upstream that
// answers every call 503 after 1ms, under a closed-loop load, over
// loopback. It reports wire calls (upstream arrivals) per logical call and
// the TCP connections the upstream accepted; one op is a whole load, ns/op
// is reported as 0.
//
//	go test -run '^$' -bench RetryDeadUpstream -count 5
//
// resilix's figure depends on the load's size: its budget starts with 10
// tokens and earns 0.2 per call plus 10 a second, and a failed retry earns
// nothing back, so n calls over t seconds may add at most 10 + 0.2n + 10t
// retries. The peers' figures do not.
func BenchmarkRetryDeadUpstream(b *testing.B) {
	const (
		calls   = 2000
		workers = 8
	)
	for _, r := range retriers {
		b.Run(r.name, func(b *testing.B) {
			for b.Loop() {
				up := httptestutil.NewUpstream(httptestutil.Options{
					Latency: httptestutil.Constant(time.Millisecond),
					Faults:  []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
				})
				var conns atomic.Int64
				srv := httptest.NewUnstartedServer(up)
				srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
					if s == http.StateNew {
						conns.Add(1)
					}
				}
				srv.Start()
				base := &http.Transport{MaxIdleConnsPerHost: 2 * workers}
				c := &http.Client{Transport: r.new(b, base)}
				start := time.Now()
				res := httptestutil.Load{Calls: calls, Workers: workers}.Run(c, srv.URL)
				elapsed := time.Since(start)
				base.CloseIdleConnections()
				srv.Close()
				if res.OK > 0 {
					b.Fatalf("%d calls succeeded against a dead upstream", res.OK)
				}
				b.ReportMetric(float64(up.Stats().Requests)/float64(calls), "wire/call")
				b.ReportMetric(ms(res.Quantile(0.5)), "p50-ms")
				b.ReportMetric(elapsed.Seconds(), "load-s")
				b.ReportMetric(float64(conns.Load()), "conns")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}
