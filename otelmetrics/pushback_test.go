package otelmetrics_test

import (
	"errors"
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

// TestPushbacks drives two keys, one behind an overloaded server (503,
// Retry-After: 1) and one behind a rate limit (429, Retry-After: 1), with
// Critical and Bulk calls, and checks resilix.pushbacks against the
// events, by status, and that the Bulk calls pushback held back are in
// resilix.shed with gate throttler.
func TestPushbacks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		tl := &tally{counts: map[string]float64{}, sums: map[string]float64{}}
		up := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Millisecond)})
		ov := httptestutil.NewOverload(up, httptestutil.OverloadOptions{})
		ov.Begin(time.Hour)
		rl := httptestutil.NewRateLimit(up, httptestutil.RateLimitOptions{PerSecond: 10})
		tr, err := transport.New(transport.Config{
			Base:     hosts{"overloaded.test": httptestutil.InMemory(ov), "limited.test": httptestutil.InMemory(rl)},
			Policies: policy.Set{Throttler: &policy.Throttler{}},
			Observer: tl.tee(obs),
		})
		if err != nil {
			t.Fatal(err)
		}
		held := 0
		for i := range 40 {
			for _, host := range []string{"overloaded.test", "limited.test"} {
				req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
				if i%2 == 1 {
					req.Header.Set("Resilix-Priority", "bulk")
				}
				resp, err := tr.RoundTrip(req)
				var rej *policy.RejectedError
				switch {
				case err == nil:
					resp.Body.Close()
				case errors.As(err, &rej):
					if rej.RetryAfter > 0 {
						held++ // pushback; the others are the estimate's
					}
				default:
					t.Fatalf("%s: %v", host, err)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()

		got := map[string]float64{}
		for k, v := range collect(t, reader).values {
			if strings.HasPrefix(k, "resilix.pushbacks{") || strings.HasPrefix(k, "resilix.shed{") {
				got[k] = v
			}
		}
		want := map[string]float64{}
		maps.Copy(want, tl.counts)
		maps.DeleteFunc(want, func(k string, _ float64) bool {
			return !strings.HasPrefix(k, "resilix.pushbacks{") && !strings.HasPrefix(k, "resilix.shed{")
		})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("resilix.pushbacks and resilix.shed (-events +collected):\n%s", diff)
		}
		for _, k := range []string{
			"resilix.pushbacks{http.response.status_code=503,key=overloaded.test}",
			"resilix.pushbacks{http.response.status_code=429,key=limited.test}",
			"resilix.shed{gate=throttler,key=overloaded.test,priority=bulk}",
		} {
			if got[k] == 0 {
				t.Errorf("%s = 0: the scenario does not exercise it", k)
			}
		}
		if held == 0 {
			t.Error("no call was held back")
		}
		t.Log(got)
	})
}
