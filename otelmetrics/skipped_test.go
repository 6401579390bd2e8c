package otelmetrics_test

import (
	"io"
	"maps"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestRetriesSkipped drives three keys whose upstream always answers 503,
// each stopping retries for a different reason, and checks
// resilix.retries.skipped against the events: a POST is not replayable, a
// small budget runs dry, and a rate limit refuses the retry (reason gate,
// with the gate).
func TestRetriesSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		tl := &tally{counts: map[string]float64{}, sums: map[string]float64{}}
		down := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
		})
		retry := &policy.Retry{BaseDelay: time.Millisecond}
		tr, err := transport.New(transport.Config{
			Base:     down.RoundTripper(),
			Policies: policy.Set{Retry: retry},
			PerKey: map[string]policy.Set{
				"budget.test": {Retry: retry, Budget: policy.Budget{MinPerSecond: -1, Max: 1}},
				"gate.test":   {Retry: retry, RateLimit: &policy.RateLimit{PerSecond: 1, Burst: 1}},
			},
			Observer: tl.tee(obs),
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		for range 5 {
			for _, c := range []struct{ method, url string }{
				{http.MethodPost, "http://post.test/"},
				{http.MethodGet, "http://budget.test/"},
				{http.MethodGet, "http://gate.test/"},
			} {
				req, err := http.NewRequest(c.method, c.url, strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := client.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			time.Sleep(2 * time.Second) // the rate limit refills
		}
		synctest.Wait()

		got := map[string]float64{}
		for k, v := range collect(t, reader).values {
			if strings.HasPrefix(k, "resilix.retries.skipped{") {
				got[k] = v
			}
		}
		want := map[string]float64{}
		maps.Copy(want, tl.counts)
		maps.DeleteFunc(want, func(k string, _ float64) bool { return !strings.HasPrefix(k, "resilix.retries.skipped{") })
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("resilix.retries.skipped (-events +collected):\n%s", diff)
		}
		for _, k := range []string{
			"resilix.retries.skipped{key=post.test,reason=not_replayable}",
			"resilix.retries.skipped{key=budget.test,reason=budget}",
			"resilix.retries.skipped{gate=rate_limit,key=gate.test,reason=gate}",
		} {
			if got[k] == 0 {
				t.Errorf("%s = 0: the scenario does not exercise it", k)
			}
		}
		t.Log(got)
	})
}
