package otelmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/transport"
)

// points flattens collected metrics into "name{k=v,...}" → value. Sums and
// gauges give their value; a histogram gives name/count and, in sums,
// name/sum.
type points struct {
	values map[string]float64
	sums   map[string]float64
	units  map[string]string
	bounds map[string][]float64
}

func pointName(name string, set attribute.Set) string {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return name + "{" + strings.Join(kv, ",") + "}"
}

func collect(t *testing.T, r sdkmetric.Reader) points {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	p := points{map[string]float64{}, map[string]float64{}, map[string]string{}, map[string][]float64{}}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otelmetrics.MeterName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otelmetrics.MeterName)
		}
		for _, m := range sm.Metrics {
			if m.Description == "" {
				t.Errorf("%s has no description", m.Name)
			}
			p.units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Errorf("%s: monotonic %v, temporality %v", m.Name, d.IsMonotonic, d.Temporality)
				}
				for _, dp := range d.DataPoints {
					p.values[pointName(m.Name, dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					n := pointName(m.Name, dp.Attributes)
					p.values[n+"/count"] = float64(dp.Count)
					p.sums[n+"/sum"] = dp.Sum
					p.bounds[m.Name] = dp.Bounds
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					p.values[pointName(m.Name, dp.Attributes)] = float64(dp.Value)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					p.values[pointName(m.Name, dp.Attributes)] = dp.Value
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return p
}

// tally counts the raw events, for the expected side of the comparison.
type tally struct {
	mu     sync.Mutex
	counts map[string]float64
	sums   map[string]float64
}

func (t *tally) add(name string, sum float64, kv ...string) {
	n := name + "{" + strings.Join(kv, ",") + "}"
	t.mu.Lock()
	defer t.mu.Unlock()
	if sum < 0 {
		t.counts[n]++
		return
	}
	t.counts[n+"/count"]++
	t.sums[n+"/sum"] += sum
}

// tee returns an Observer that reports every event to o and counts it in t.
func (t *tally) tee(o *policy.Observer) *policy.Observer {
	return &policy.Observer{
		CallDone: func(c policy.CallInfo) {
			t.add("resilix.calls", -1, "key="+c.Key, "outcome="+c.Outcome.String())
			t.add("resilix.call.duration", c.Duration.Seconds(), "key="+c.Key, "outcome="+c.Outcome.String())
			o.CallDone(c)
		},
		AttemptDone: func(a policy.AttemptInfo) {
			t.add("resilix.attempts", -1, "key="+a.Key, "kind="+a.Kind.String(), "outcome="+a.Outcome.String())
			o.AttemptDone(a)
		},
		Refused: func(r policy.Refusal) {
			t.add("resilix.shed", -1, "gate="+r.Gate.String(), "key="+r.Key, "priority="+r.Priority.String())
			o.Refused(r)
		},
		RetrySkipped: func(k policy.RetrySkip) {
			kv := []string{"key=" + k.Key, "reason=" + k.Reason.String()}
			if k.Reason == policy.SkipGate {
				kv = append([]string{"gate=" + k.Gate.String()}, kv...)
			}
			t.add("resilix.retries.skipped", -1, kv...)
			o.RetrySkipped(k)
		},
		HedgeStarted: func(h policy.HedgeInfo) {
			t.add("resilix.hedges", -1, "key="+h.Key, "outcome=started")
			t.add("resilix.hedge.threshold", h.Threshold.Seconds(), "key="+h.Key)
			o.HedgeStarted(h)
		},
		HedgeWon: func(h policy.HedgeInfo) {
			t.add("resilix.hedges", -1, "key="+h.Key, "outcome=won")
			o.HedgeWon(h)
		},
		HedgeSuppressed: func(h policy.HedgeSuppression) {
			t.add("resilix.hedges", -1, "key="+h.Key, "outcome=suppressed", "reason="+h.Reason.String())
			o.HedgeSuppressed(h)
		},
		Attach: o.Attach,
		Pushback: func(p policy.Pushback) {
			t.add("resilix.pushbacks", -1, "http.response.status_code="+strconv.Itoa(p.StatusCode), "key="+p.Key)
			o.Pushback(p)
		},
	}
}

// hosts routes each request to the RoundTripper of its host.
type hosts map[string]http.RoundTripper

func (h hosts) RoundTrip(r *http.Request) (*http.Response, error) {
	rt, ok := h[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("no upstream for %q", r.URL.Host)
	}
	return rt.RoundTrip(r)
}

// fixedStates is a StateSource with fixed states, for the gauges the
// transport does not report yet (the limiter).
type fixedStates map[string]policy.Snapshot

func (f fixedStates) States(fn func(string, policy.Snapshot)) bool {
	for _, k := range slices.Sorted(maps.Keys(f)) {
		fn(k, f[k])
	}
	return true
}

// caller is what the test saw of one key's calls.
type caller struct {
	calls    int
	outcomes map[string]float64 // by the outcome the caller got
	shed     map[string]float64 // gate/priority of refused calls
	duration time.Duration      // sum of call durations
}

func call(t *testing.T, c *http.Client, url string, prio shedding.Priority, got *caller) {
	t.Helper()
	ctx := shedding.WithPriority(context.Background(), prio)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := c.Do(req)
	got.duration += time.Since(start)
	got.calls++
	var rej *policy.RejectedError
	switch {
	case errors.As(err, &rej):
		got.outcomes["rejected"]++
		got.shed["gate="+rej.Gate.String()+",priority="+rej.Priority.String()]++
	case err != nil:
		t.Fatalf("GET %s: %v", url, err)
	default:
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			got.outcomes["success"]++
		} else {
			got.outcomes["failure"]++
		}
	}
}

// TestTransport drives a real Transport over in-memory upstreams, with
// hedges, retries and refusals, and checks the collected metrics against
// the events, against what the caller and the upstreams saw, and against
// the transport's own state.
func TestTransport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		tl := &tally{counts: map[string]float64{}, sums: map[string]float64{}}

		// a.test: mostly 5-15ms, 4% at 300ms, 5% 503s. Hedged, retried,
		// behind a breaker.
		hedged := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Mix(
				httptestutil.Weighted{Weight: 96, Latency: httptestutil.Uniform(5*time.Millisecond, 15*time.Millisecond)},
				httptestutil.Weighted{Weight: 4, Latency: httptestutil.Constant(300 * time.Millisecond)},
			),
			Faults: []httptestutil.Fault{{Probability: 0.05, Status: http.StatusServiceUnavailable}},
			Seed:   1,
		})
		// b.test: fast, behind a rate limit that refuses most calls.
		limited := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Millisecond), Seed: 2})

		tr, err := transport.New(transport.Config{
			Base: hosts{"a.test": hedged.RoundTripper(), "b.test": limited.RoundTripper()},
			Policies: policy.Set{
				Retry:   &policy.Retry{BaseDelay: time.Millisecond},
				Hedge:   &policy.Hedge{},
				Breaker: &policy.Breaker{},
				Timeout: &policy.Timeout{PerAttempt: time.Second},
			},
			PerKey: map[string]policy.Set{
				"b.test": {RateLimit: &policy.RateLimit{PerSecond: 10, Burst: 1}},
			},
			Observer: tl.tee(obs),
		})
		if err != nil {
			t.Fatal(err)
		}
		obs.Attach(fixedStates{"fake.test": {
			HasBreaker: true, BreakerState: policy.BreakerHalfOpen,
			HasLimiter: true, LimiterLimit: 42,
		}})
		client := &http.Client{Transport: tr}

		a := &caller{outcomes: map[string]float64{}, shed: map[string]float64{}}
		b := &caller{outcomes: map[string]float64{}, shed: map[string]float64{}}
		for i := range 300 {
			call(t, client, "http://a.test/", shedding.Critical, a)
			if i%2 == 0 {
				prio := shedding.Critical
				if i%4 == 0 {
					prio = shedding.Bulk
				}
				call(t, client, "http://b.test/", prio, b)
			}
		}
		synctest.Wait() // hedge losers and late timers settle

		got := collect(t, reader)

		// 1. The instruments are exactly what the events say, attribute
		// for attribute.
		want := maps.Clone(tl.counts)
		ma, mb := tr.Measured("a.test"), tr.Measured("b.test")
		if !ma.Known || !mb.Known {
			t.Fatal("keys unknown to the transport")
		}
		want["resilix.breaker.state{key=a.test}"] = float64(ma.BreakerState)
		want["resilix.budget.balance{key=a.test}"] = ma.BudgetBalance // time stands still in the bubble
		want["resilix.hedge.threshold.current{key=a.test}"] = ma.HedgeThreshold.Seconds()
		want["resilix.breaker.state{key=fake.test}"] = 2
		want["resilix.limiter.limit{key=fake.test}"] = 42
		if diff := cmp.Diff(want, got.values); diff != "" {
			t.Errorf("collected metrics (-events +collected):\n%s", diff)
		}
		if diff := cmp.Diff(tl.sums, got.sums, cmpopts.EquateApprox(1e-9, 0)); diff != "" {
			t.Errorf("histogram sums (-events +collected):\n%s", diff)
		}

		// 2. Against what the caller and the upstreams saw.
		sum := func(prefix string) float64 {
			var s float64
			for k, v := range got.values {
				if strings.HasPrefix(k, prefix) && strings.HasSuffix(k, "}") {
					s += v
				}
			}
			return s
		}
		for _, c := range []struct {
			key string
			got *caller
			up  *httptestutil.Upstream
		}{{"a.test", a, hedged}, {"b.test", b, limited}} {
			if n := sum("resilix.calls{key=" + c.key); n != float64(c.got.calls) {
				t.Errorf("%s: resilix.calls sums to %v, made %d calls", c.key, n, c.got.calls)
			}
			for o, n := range c.got.outcomes {
				if v := got.values["resilix.calls{key="+c.key+",outcome="+o+"}"]; v != n {
					t.Errorf("%s: resilix.calls{outcome=%s} = %v, the caller got %v", c.key, o, v, n)
				}
			}
			if n, wire := sum("resilix.attempts{key="+c.key), c.up.Stats().Requests; n != float64(wire) {
				t.Errorf("%s: resilix.attempts sums to %v, the upstream saw %d requests", c.key, n, wire)
			}
			for gp, n := range c.got.shed {
				gate, prio, _ := strings.Cut(gp, ",")
				if v := got.values["resilix.shed{"+gate+",key="+c.key+","+prio+"}"]; v != n {
					t.Errorf("%s: resilix.shed{%s} = %v, the caller saw %v refusals", c.key, gp, v, n)
				}
			}
			var d float64
			for k, v := range got.sums {
				if strings.HasPrefix(k, "resilix.call.duration{key="+c.key+",") {
					d += v
				}
			}
			if diff := d - c.got.duration.Seconds(); diff > 1e-6 || diff < -1e-6 {
				t.Errorf("%s: call durations sum to %vs, the caller measured %v", c.key, d, c.got.duration)
			}
		}

		// 3. Hedges: won <= started; every hedge started is a hedge attempt
		// and records its threshold.
		started := got.values["resilix.hedges{key=a.test,outcome=started}"]
		won := got.values["resilix.hedges{key=a.test,outcome=won}"]
		if won > started {
			t.Errorf("hedges won %v > started %v", won, started)
		}
		if n := sum("resilix.attempts{key=a.test,kind=hedge"); n != started {
			t.Errorf("%v hedge attempts for %v hedges started", n, started)
		}
		if n := got.values["resilix.hedge.threshold{key=a.test}/count"]; n != started {
			t.Errorf("%v thresholds recorded for %v hedges started", n, started)
		}

		// 4. The scenario did exercise what it means to.
		for _, k := range []string{
			"resilix.hedges{key=a.test,outcome=started}",
			"resilix.hedges{key=a.test,outcome=won}",
			"resilix.hedges{key=a.test,outcome=suppressed,reason=warming}",
			"resilix.attempts{key=a.test,kind=retry,outcome=success}",
			"resilix.attempts{key=a.test,kind=first,outcome=discarded}",
			"resilix.shed{gate=rate_limit,key=b.test,priority=critical}",
			"resilix.shed{gate=rate_limit,key=b.test,priority=bulk}",
		} {
			if got.values[k] == 0 {
				t.Errorf("%s = 0: the scenario does not exercise it", k)
			}
		}
		if _, ok := got.values["resilix.budget.balance{key=b.test}"]; ok {
			t.Error("b.test has no budget but reports a balance")
		}
		t.Logf("a.test: %v calls, %v hedges started, %v won; b.test: %v refused",
			a.calls, started, won, b.outcomes["rejected"])

		// 5. Units and buckets.
		wantUnits := map[string]string{
			"resilix.calls": "{call}", "resilix.attempts": "{attempt}", "resilix.hedges": "{hedge}",
			"resilix.shed": "{attempt}", "resilix.call.duration": "s", "resilix.hedge.threshold": "s",
			"resilix.breaker.state": "{state}", "resilix.limiter.limit": "{request}",
			"resilix.budget.balance": "{token}", "resilix.hedge.threshold.current": "s",
		}
		if diff := cmp.Diff(wantUnits, got.units); diff != "" {
			t.Errorf("units (-want +got):\n%s", diff)
		}
		wantBounds := []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
		for _, name := range []string{"resilix.call.duration", "resilix.hedge.threshold"} {
			if diff := cmp.Diff(wantBounds, got.bounds[name]); diff != "" {
				t.Errorf("%s bounds (-want +got):\n%s", name, diff)
			}
		}
	})
}

// TestSharedObserver gives one Observer to two transports: the counters
// add up and the gauges show the keys of both.
func TestSharedObserver(t *testing.T) {
	reader, obs := newObserver(t)
	up := httptestutil.NewUpstream(httptestutil.Options{})
	// The observer holds transports weakly: a transport nobody keeps may
	// be collected, gauges and all, before the reader collects.
	var keep []*transport.Transport
	defer runtime.KeepAlive(&keep)
	for _, key := range []string{"one", "two"} {
		tr, err := transport.New(transport.Config{
			Base:     up.RoundTripper(),
			Policies: policy.Set{Breaker: &policy.Breaker{}},
			Key:      func(*http.Request) string { return key },
			Observer: obs,
		})
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, tr)
		for range 3 {
			resp, err := tr.RoundTrip(httptestRequest(t))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	got := collect(t, reader).values
	want := map[string]float64{
		"resilix.calls{key=one,outcome=success}":               3,
		"resilix.calls{key=two,outcome=success}":               3,
		"resilix.call.duration{key=one,outcome=success}/count": 3,
		"resilix.call.duration{key=two,outcome=success}/count": 3,
		"resilix.attempts{key=one,kind=first,outcome=success}": 3,
		"resilix.attempts{key=two,kind=first,outcome=success}": 3,
		"resilix.breaker.state{key=one}":                       0,
		"resilix.breaker.state{key=two}":                       0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func httptestRequest(t *testing.T) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestNewNilProvider(t *testing.T) {
	if _, err := otelmetrics.New(nil); err == nil {
		t.Fatal("New(nil) returned no error")
	}
}

// newObserver returns otelmetrics' Observer on a MeterProvider of its own,
// shut down with the test, and the reader that collects from it.
func newObserver(t *testing.T) (*sdkmetric.ManualReader, *policy.Observer) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	return reader, obs
}
