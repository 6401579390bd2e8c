// Command hedging shows what resilix's hedging does to tail latency, and
// why its threshold is a live quantile rather than a constant. It runs
// against a local upstream on loopback, in two phases:
//
//  1. a bimodal upstream (97% of calls take 4ms, 3% take 150ms): the same
//     calls through plain net/http and through resilix hedging at p95;
//  2. a brownout, every call now ~40ms: resilix again, unchanged, while
//     the quantile follows the latency up; then the same brownout through
//     a hedger with a fixed delay, set to the threshold resilix had
//     learned while calm (fixedhedge.Hedger, in internal/fixedhedge).
//
// It prints p50/p99/p99.9 and the extra wire calls hedging cost, as
// measured: the calls the upstream received.
//
//	go run ./examples/hedging
package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/internal/fixedhedge"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

const workers = 8

func main() {
	if _, err := run(os.Stdout, 3000, loopback); err != nil {
		fmt.Fprintln(os.Stderr, "hedging:", err)
		os.Exit(1)
	}
}

// row is one line of the table.
type row struct {
	phase, client string
	res           httptestutil.LoadResult
	wire          int64
}

func (r row) extra() float64 {
	n := len(r.res.Latencies)
	return float64(r.wire-int64(n)) / float64(n)
}

// A backend makes the upstream reachable: it returns its URL, a func that
// returns a new connection pool to it, and a func that shuts it down.
type backend func(up *httptestutil.Upstream) (url string, pool func() http.RoundTripper, stop func())

// loopback serves the upstream on a local socket, the demo's way.
func loopback(up *httptestutil.Upstream) (string, func() http.RoundTripper, func()) {
	srv := httptest.NewServer(up)
	var pools []*http.Transport
	pool := func() http.RoundTripper {
		p := &http.Transport{MaxIdleConnsPerHost: 2 * workers}
		pools = append(pools, p)
		return p
	}
	return srv.URL, pool, func() {
		for _, p := range pools {
			p.CloseIdleConnections()
		}
		srv.Close()
	}
}

// run makes calls calls per bimodal row and half as many in the brownout,
// against the upstream served by serve.
func run(w io.Writer, calls int, serve backend) ([]row, error) {
	up := httptestutil.NewUpstream(httptestutil.Options{
		Latency: httptestutil.Bimodal(4*time.Millisecond, 150*time.Millisecond, 0.03),
		Seed:    1,
	})
	url, pool, stop := serve(up)
	defer stop()
	key := strings.TrimPrefix(url, "http://")

	// Every client gets the same kind of connection pool, so the comparison
	// is of hedging and nothing else.
	plain := pool()
	rt, err := transport.New(transport.Config{
		Base: pool(),
		Policies: policy.Set{
			Hedge:   &policy.Hedge{Quantile: 0.95},
			Timeout: &policy.Timeout{PerAttempt: 2 * time.Second},
		},
	})
	if err != nil {
		return nil, err
	}
	defer rt.CloseIdleConnections()

	load := httptestutil.Load{Calls: calls, Workers: workers}
	measure := func(phase, client string, c *http.Client, n int) row {
		up.ResetStats()
		l := load
		l.Calls = n
		res := l.Run(c, url)
		return row{phase, client, res, up.Stats().Requests}
	}

	var rows []row
	rows = append(rows, measure("bimodal 97% 4ms / 3% 150ms", "net/http", &http.Client{Transport: plain}, calls))
	hedged := &http.Client{Transport: rt}
	httptestutil.Load{Calls: 200, Workers: workers}.Run(hedged, url) // let the window learn
	rows = append(rows, measure("bimodal 97% 4ms / 3% 150ms", "resilix hedge p95", hedged, calls))
	calm := rt.Measured(key).HedgeThreshold

	up.SetLatency(httptestutil.Uniform(35*time.Millisecond, 45*time.Millisecond))
	rows = append(rows, measure("brownout: all calls ~40ms", "resilix hedge p95", hedged, calls/2))
	brown := rt.Measured(key).HedgeThreshold
	fixed := &http.Client{Transport: fixedhedge.Hedger{Base: pool(), Delay: calm}}
	rows = append(rows, measure("brownout: all calls ~40ms", "fixed delay "+ms(calm).String(), fixed, calls/2))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tclient\tcalls\tp50\tp99\tp99.9\twire calls\textra\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%v\t%v\t%d\t%+.1f%%\t\n", r.phase, r.client, len(r.res.Latencies),
			ms(r.res.Quantile(0.5)), ms(r.res.Quantile(0.99)), ms(r.res.Quantile(0.999)), r.wire, 100*r.extra())
	}
	if err := tw.Flush(); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, `
resilix's hedge threshold was %v while calm and %v after the brownout,
with nothing reconfigured. In the brownout, hedging at the live p95 cost
%+.1f%% wire calls; a fixed delay of %v, resilix's calm threshold, cost %+.1f%%.
`, ms(calm), ms(brown), 100*rows[2].extra(), ms(calm), 100*rows[3].extra())
	return rows, nil
}

// ms rounds a duration for the table.
func ms(d time.Duration) time.Duration {
	if d >= 10*time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Microsecond)
}
