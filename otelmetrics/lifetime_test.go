package otelmetrics

import (
	"context"
	"net/http"
	"runtime"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/tenant"
	"github.com/resilix/resilix/transport"
)

// instantBase answers every request at once with an empty 200.
type instantBase struct{}

func (instantBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
}

// build returns a Transport reporting to obs, with every gauge's policy on
// and a scope for each key, created by a few calls. The hedge's latency
// window and the limiter's tenant tracker (allocated because the calls name
// a tenant) make each scope weigh some kilobytes.
func build(t *testing.T, obs *policy.Observer, keys ...string) *transport.Transport {
	t.Helper()
	tr, err := transport.New(transport.Config{
		Base:     instantBase{},
		Observer: obs,
		Policies: policy.Set{
			Retry:   &policy.Retry{},
			Hedge:   &policy.Hedge{},
			Breaker: &policy.Breaker{},
			Limiter: &policy.Limiter{},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		for range 3 {
			ctx := tenant.With(context.Background(), "acme")
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+k+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	return tr
}

// attached returns the number of sources r holds.
func (r *recorder) attached() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sources)
}

// heapAfterGC collects garbage until weak pointers to it are cleared and
// returns the bytes of live heap objects.
func heapAfterGC() uint64 {
	for range 3 {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// gaugeKeys collects from reader and returns, per gauge, the keys it has
// a point for.
func gaugeKeys(t *testing.T, reader sdkmetric.Reader) map[string][]string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(attrKey)
					keys[m.Name] = append(keys[m.Name], v.AsString())
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					v, _ := p.Attributes.Value(attrKey)
					keys[m.Name] = append(keys[m.Name], v.AsString())
				}
			}
		}
	}
	return keys
}

// TestDroppedTransportsAreCollected builds a thousand transports with one
// Observer, as a service that rebuilds its transport on every
// configuration reload does, and drops them: the Observer keeps none of
// them alive, forgets their sources on the next collection, and goes on
// reporting the transport that is still alive.
func TestDroppedTransportsAreCollected(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := newRecorder(mp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	obs := r.observer()
	live := build(t, obs, "live.test")
	keys := []string{"a.test", "b.test", "c.test"}

	// Warm up what lasts beyond a transport, whatever the number built:
	// the attribute sets of the keys, the SDK's points for them.
	for range 10 {
		build(t, obs, keys...)
	}
	gaugeKeys(t, reader)
	before := heapAfterGC()

	const n = 1000
	all := make([]*transport.Transport, n)
	for i := range all {
		all[i] = build(t, obs, keys...)
	}
	gaugeKeys(t, reader)
	peak := heapAfterGC()
	if got := r.attached(); got != n+1 {
		t.Fatalf("%d sources attached while %d transports are alive", got, n+1)
	}
	runtime.KeepAlive(all)
	all = nil // and nothing else of the test holds them
	after := heapAfterGC()
	got := gaugeKeys(t, reader) // drops the dead sources
	if a := r.attached(); a != 1 {
		t.Errorf("%d sources attached after a collection, want 1: the live transport's", a)
	}
	collected := heapAfterGC()
	t.Logf("heap: %d KiB before, %d KiB with %d transports alive, %d KiB once dropped, %d KiB after the collection that forgot them",
		before>>10, peak>>10, n, after>>10, collected>>10)
	if grown := peak - before; grown < 16<<20 {
		t.Fatalf("%d transports took only %d KiB: the test would show nothing", n, grown>>10)
	}
	// Generous: a twentieth of what the transports took, or 1 MiB.
	if margin := max(uint64(1<<20), (peak-before)/20); collected > before+margin {
		t.Errorf("heap %d KiB after dropping the transports, want at most %d KiB (%d KiB before)",
			collected>>10, (before+margin)>>10, before>>10)
	}

	for _, g := range []string{"resilix.breaker.state", "resilix.limiter.limit", "resilix.budget.balance"} {
		if ks := got[g]; len(ks) != 1 || ks[0] != "live.test" {
			t.Errorf("%s has points for %q, want only live.test", g, ks)
		}
	}
	build(t, obs) // a new transport attaches alongside
	if ks := gaugeKeys(t, reader)["resilix.breaker.state"]; len(ks) != 1 || ks[0] != "live.test" {
		t.Errorf("after a new transport: breaker.state has points for %q, want live.test", ks)
	}
	runtime.KeepAlive(live)
}

// TestAttachForgetsDeadSources: with nothing ever collecting, the sources
// of transports that were dropped are forgotten as new ones attach, so
// that the list stays bounded by the live transports.
func TestAttachForgetsDeadSources(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	r, err := newRecorder(mp, Options{})
	if err != nil {
		t.Fatal(err)
	}
	obs := r.observer()
	live := build(t, obs, "live.test")
	most := 0
	for i := range 1000 {
		build(t, obs, "a.test")
		if i%10 == 9 {
			runtime.GC()
		}
		most = max(most, r.attached())
	}
	// Ten transports are built between collections of garbage, so the
	// list holds at most those and the live one, twice over for the
	// amortized pruning, or the floor below which it is not pruned.
	t.Logf("at most %d sources attached", most)
	if bound := max(2*(10+1), minPruneAt) + 1; most > bound {
		t.Errorf("up to %d sources attached, want at most %d", most, bound)
	}
	runtime.KeepAlive(live)
}
