package oteltrace_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/oteltrace"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// hosts routes each request to the RoundTripper of its host.
type hosts map[string]http.RoundTripper

func (h hosts) RoundTrip(r *http.Request) (*http.Response, error) {
	rt, ok := h[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("no upstream for %q", r.URL.Host)
	}
	return rt.RoundTrip(r)
}

// TestTransport drives a real Transport, with hedges, retries, refusals
// and skipped retries, each call under a span of its own as otelhttp would
// make, and checks each span against the call it covered.
func TestTransport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, rec := recorder(t)
		// a.test: mostly 5-15ms, 4% at 300ms, 10% 503s. Hedged and retried.
		hedged := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Mix(
				httptestutil.Weighted{Weight: 96, Latency: httptestutil.Uniform(5*time.Millisecond, 15*time.Millisecond)},
				httptestutil.Weighted{Weight: 4, Latency: httptestutil.Constant(300 * time.Millisecond)},
			),
			Faults: []httptestutil.Fault{{Probability: 0.1, Status: http.StatusServiceUnavailable}},
			Seed:   1,
		})
		// b.test: fast and always 503, behind a rate limit that refuses
		// most calls and retries.
		limited := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}},
		})
		var last policy.CallInfo // of the call just made
		tr, err := transport.New(transport.Config{
			Base: hosts{"a.test": hedged.RoundTripper(), "b.test": limited.RoundTripper()},
			Policies: policy.Set{
				Retry:   &policy.Retry{BaseDelay: time.Millisecond},
				Hedge:   &policy.Hedge{},
				Timeout: &policy.Timeout{PerAttempt: time.Second},
			},
			PerKey: map[string]policy.Set{
				"b.test": {Retry: &policy.Retry{BaseDelay: time.Millisecond}, RateLimit: &policy.RateLimit{PerSecond: 20, Burst: 1}},
			},
			Observer: policy.JoinObservers(oteltrace.New(), &policy.Observer{
				CallDone: func(c policy.CallInfo) { last = c },
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}

		type call struct {
			info policy.CallInfo
			post bool
		}
		calls := map[string]call{} // by span name
		for i := range 300 {
			method, url := http.MethodGet, "http://a.test/"
			switch {
			case i%3 == 1:
				url = "http://b.test/"
			case i%9 == 2:
				method = http.MethodPost // not replayable
			}
			name := fmt.Sprintf("%s %s #%d", method, url, i)
			ctx, span := tp.Tracer("test").Start(context.Background(), name)
			req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			synctest.Wait() // hedge losers report before the span ends
			span.End()
			calls[name] = call{info: last, post: method == http.MethodPost}
			time.Sleep(10 * time.Millisecond)
		}

		seen := map[string]int{}
		var attempts int64
		for _, s := range rec.Ended() {
			c, ok := calls[s.Name()]
			if !ok {
				t.Fatalf("span %q covers no call", s.Name())
			}
			var n, hedges, started, won int
			numbers := map[int64]bool{}
			for _, e := range s.Events() {
				attrs := attribute.NewSet(e.Attributes...)
				get := func(k string) attribute.Value { v, _ := attrs.Value(attribute.Key(k)); return v }
				seen[e.Name]++
				switch e.Name {
				case "resilix.attempt":
					n++
					num := get("resilix.attempt.number").AsInt64()
					if numbers[num] || num < 1 || num > int64(c.info.WireAttempts) {
						t.Errorf("%s: attempt number %d (wire attempts %d, seen %v)", s.Name(), num, c.info.WireAttempts, numbers)
					}
					numbers[num] = true
					kind, outcome := get("resilix.attempt.kind").AsString(), get("resilix.attempt.outcome").AsString()
					seen[e.Name+" "+kind+" "+outcome]++
					if kind == "hedge" {
						hedges++
					}
					if get("resilix.attempt.discarded").AsBool() != (outcome == "discarded") {
						t.Errorf("%s: discarded %v with outcome %s", s.Name(), get("resilix.attempt.discarded").AsBool(), outcome)
					}
				case "resilix.hedge.started":
					started++
				case "resilix.hedge.won":
					won++
				case "resilix.retry.skipped":
					seen[e.Name+" "+get("resilix.retry.reason").AsString()]++
				case "resilix.refused":
					seen[e.Name+" "+get("resilix.attempt.kind").AsString()+" "+get("resilix.gate").AsString()]++
				}
			}
			attempts += int64(n)
			if n != c.info.WireAttempts {
				t.Errorf("%s: %d attempt events, %d wire attempts", s.Name(), n, c.info.WireAttempts)
			}
			if hedges != started || won > started {
				t.Errorf("%s: %d hedge attempts, %d hedges started, %d won", s.Name(), hedges, started, won)
			}
			var resend []int64
			for _, kv := range s.Attributes() {
				if kv.Key == "http.request.resend_count" {
					resend = append(resend, kv.Value.AsInt64())
				}
			}
			switch {
			case c.info.WireAttempts > 1 && (len(resend) != 1 || resend[0] != int64(c.info.WireAttempts-1)):
				t.Errorf("%s: resend count %v, wire attempts %d", s.Name(), resend, c.info.WireAttempts)
			case c.info.WireAttempts <= 1 && len(resend) != 0:
				t.Errorf("%s: resend count %v, wire attempts %d", s.Name(), resend, c.info.WireAttempts)
			}
			if c.post && (hedges > 0 || c.info.WireAttempts > 1) {
				t.Errorf("%s: a POST was sent %d times", s.Name(), c.info.WireAttempts)
			}
		}
		if len(rec.Ended()) != len(calls) {
			t.Errorf("%d spans for %d calls", len(rec.Ended()), len(calls))
		}
		if up := hedged.Stats().Requests + limited.Stats().Requests; attempts != up {
			t.Errorf("%d attempt events, the upstreams saw %d requests", attempts, up)
		}

		// The scenario did exercise what it means to.
		for _, k := range []string{
			"resilix.attempt retry success",
			"resilix.attempt retry failure",
			"resilix.attempt hedge success",
			"resilix.attempt first discarded",
			"resilix.hedge.started",
			"resilix.hedge.won",
			"resilix.hedge.suppressed",
			"resilix.refused first rate_limit",
			"resilix.refused retry rate_limit",
			"resilix.retry.skipped gate",
			"resilix.retry.skipped not_replayable",
		} {
			if seen[k] == 0 {
				t.Errorf("no %s: the scenario does not exercise it", k)
			}
		}
		t.Log(seen)
	})
}
