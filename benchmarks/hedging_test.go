package benchmarks

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

// The hedging benchmarks measure what each library's hedging does to the
// latency a caller sees and to the load on the upstream, over loopback.
// One op is a whole closed-loop load; ns/op is reported as 0.
//
//	go test -run '^$' -bench Hedging -count 5

// hedgeRun is one hedging scenario for one client. Every scenario starts
// the same way: a plain net/http client measures the upstream's calm p95
// (the figure a fixed delay is set to), then the client under test is
// warmed on the calm upstream so that the live estimators have learned it.
type hedgeRun struct {
	workers          int
	calm             httptestutil.Latency
	calmCalls, learn int
	measured         httptestutil.Latency // nil: the calm latency goes on
	measuredCalls    int
	seed             uint64
}

func (s hedgeRun) run(b *testing.B, h *hedger) {
	up := httptestutil.NewUpstream(httptestutil.Options{Latency: s.calm, Seed: s.seed})
	srv := httptest.NewServer(up)
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 2 * s.workers}
	defer base.CloseIdleConnections()

	plain := &http.Client{Transport: base}
	calmP95 := httptestutil.Load{Calls: s.calmCalls, Workers: s.workers}.Run(plain, srv.URL).Quantile(0.95)
	c := plain
	if h != nil {
		c = &http.Client{Transport: h.new(b, base, calmP95)}
	}
	httptestutil.Load{Calls: s.learn, Workers: s.workers}.Run(c, srv.URL)
	if s.measured != nil {
		up.SetLatency(s.measured)
	}
	up.ResetStats()
	res := httptestutil.Load{Calls: s.measuredCalls, Workers: s.workers}.Run(c, srv.URL)
	reportLoad(b, res, up.Stats().Requests)
	b.ReportMetric(ms(calmP95), "calm-p95-ms")
	if res.Failed > 0 {
		b.Errorf("%d calls failed", res.Failed)
	}
}

// BenchmarkHedgingBrownout: the upstream answers in 4ms, then every call
// takes 35-45ms. The measured load starts at the switch, so it includes
// the moment a live estimate catches up. A delay fixed at the calm p95
// hedges every brownout call; a live quantile should keep the extra wire
// calls near 1 - q.
func BenchmarkHedgingBrownout(b *testing.B) {
	s := hedgeRun{
		workers:       16,
		calm:          httptestutil.Constant(4 * time.Millisecond),
		calmCalls:     500,
		learn:         600,
		measured:      httptestutil.Uniform(35*time.Millisecond, 45*time.Millisecond),
		measuredCalls: 800,
		seed:          1,
	}
	for i := range hedgers {
		b.Run(hedgers[i].name, func(b *testing.B) {
			for b.Loop() {
				s.run(b, &hedgers[i])
			}
		})
	}
}

// BenchmarkHedgingBimodal: a calm upstream where 97% of calls take 4ms and
// 3% take 150ms. Without hedging p99 is the slow mode; a hedge at p95 should
// cut it to about two fast calls for about 5% more wire calls.
func BenchmarkHedgingBimodal(b *testing.B) {
	s := hedgeRun{
		workers:       8,
		calm:          httptestutil.Bimodal(4*time.Millisecond, 150*time.Millisecond, 0.03),
		calmCalls:     300,
		learn:         300,
		measuredCalls: 1500,
		seed:          2,
	}
	b.Run("net-http", func(b *testing.B) {
		for b.Loop() {
			s.run(b, nil)
		}
	})
	for i := range hedgers {
		b.Run(hedgers[i].name, func(b *testing.B) {
			for b.Loop() {
				s.run(b, &hedgers[i])
			}
		})
	}
}
