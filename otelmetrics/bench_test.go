package otelmetrics_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/resilix/resilix/otelmetrics"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// okBase answers every request with a fresh 200 and no body, so that only
// resilix's cost, and the observer's, is on the clock.
type okBase struct{}

func (okBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// observed returns a Transport with Retry over okBase, reporting to an
// otelmetrics Observer on an SDK MeterProvider, or to nothing with a nil
// provider.
func observed(tb testing.TB, withOTel bool) http.RoundTripper {
	tb.Helper()
	cfg := transport.Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}}
	if withOTel {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		tb.Cleanup(func() { mp.Shutdown(context.Background()) })
		obs, err := otelmetrics.New(mp)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Observer = obs
	}
	tr, err := transport.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func roundTrip(tb testing.TB, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		tb.Fatal(err)
	}
	resp.Body.Close()
}

// BenchmarkObserverCost is one successful unhedged call with no observer
// and with the otelmetrics observer (a call and an attempt counted, a
// duration recorded) on the SDK.
func BenchmarkObserverCost(b *testing.B) {
	for _, bc := range []struct {
		name string
		otel bool
	}{{"nil", false}, {"otel", true}} {
		b.Run(bc.name, func(b *testing.B) {
			rt := observed(b, bc.otel)
			req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
			b.ReportAllocs()
			for b.Loop() {
				roundTrip(b, rt, req)
			}
		})
		b.Run(bc.name+"-parallel", func(b *testing.B) {
			rt := observed(b, bc.otel)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
				for pb.Next() {
					roundTrip(b, rt, req)
				}
			})
		})
	}
}

// TestObserverAllocs holds the observer to its budget: once a key's
// attributes are cached, recording a call allocates nothing more than the
// transport does without an observer.
func TestObserverAllocs(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
	var allocs [2]float64
	for i, withOTel := range []bool{false, true} {
		rt := observed(t, withOTel)
		roundTrip(t, rt, req) // warm the key
		allocs[i] = testing.AllocsPerRun(200, func() { roundTrip(t, rt, req) })
	}
	if allocs[1] > allocs[0] {
		t.Errorf("a call allocates %v times with the otelmetrics observer, %v without", allocs[1], allocs[0])
	}
}

// BenchmarkEvents is the observer's own cost per event, on a warm key: the
// attribute cache's lookup and the SDK's recording.
func BenchmarkEvents(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { mp.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(mp)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("CallDone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			obs.CallDone(policy.CallInfo{Context: ctx, Key: "a.test", Outcome: policy.Success, Duration: time.Millisecond})
		}
	})
	b.Run("AttemptDone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: "a.test", Kind: policy.AttemptFirst, Outcome: policy.Success})
		}
	})
}
