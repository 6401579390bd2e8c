package otelmetrics_test

import (
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestHedgeThresholdGauge: resilix.hedge.threshold.current is the key's
// threshold as the transport's snapshot has it, read at collection, with
// or without hedges being sent; a key still warming, or one that does not
// hedge, has no point.
func TestHedgeThresholdGauge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		// Every call takes 10ms: none is ever slow enough to be hedged,
		// so the threshold histogram records nothing.
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(10 * time.Millisecond), Seed: 1})
		tr, err := transport.New(transport.Config{
			Base:     up.RoundTripper(),
			Policies: policy.Set{Hedge: &policy.Hedge{MinSamples: 20}},
			PerKey:   map[string]policy.Set{"plain.test": {}},
			Observer: obs,
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		get := func(url string, n int) {
			for range n {
				resp, err := client.Get(url)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		const gauge = "resilix.hedge.threshold.current{key=hedged.test}"

		get("http://hedged.test/", 19)
		get("http://plain.test/", 30)
		got := collect(t, reader).values
		if v, ok := got[gauge]; ok {
			t.Errorf("%s = %v with 19 latencies of the 20 Hedge.MinSamples needs: want no point", gauge, v)
		}
		if v, ok := got["resilix.hedge.threshold.current{key=plain.test}"]; ok {
			t.Errorf("plain.test does not hedge, but has a threshold of %v", v)
		}

		get("http://hedged.test/", 1)
		m := tr.Measured("hedged.test")
		if m.HedgeThreshold <= 0 {
			t.Fatalf("Measured(hedged.test).HedgeThreshold = %v after 20 calls", m.HedgeThreshold)
		}
		got = collect(t, reader).values
		if v, want := got[gauge], m.HedgeThreshold.Seconds(); v != want {
			t.Errorf("%s = %v, want the snapshot's %v", gauge, v, want)
		}
		// Constant latency: the threshold is the upper bound of the
		// estimator's bucket holding 10ms (buckets are at most 1/8 of
		// their lower bound wide; package estimator).
		if v := got[gauge]; !(v >= 0.010 && v <= 0.010*9/8) {
			t.Errorf("%s = %v, want 10ms to 11.25ms (every call took 10ms)", gauge, v)
		}
		if n := got["resilix.hedge.threshold{key=hedged.test}/count"]; n != 0 {
			t.Errorf("%v thresholds recorded, but no hedge was sent", n)
		}
		if n := got["resilix.hedges{key=hedged.test,outcome=started}"]; n != 0 {
			t.Errorf("%v hedges started against a constant latency", n)
		}
	})
}
