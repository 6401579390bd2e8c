package oteltrace_test

import (
	"context"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/resilix/resilix/oteltrace"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// okBase answers every request with a fresh 200 and no body.
type okBase struct{}

func (okBase) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// traced returns a Transport with Retry over okBase, reporting to obs.
func traced(tb testing.TB, obs *policy.Observer) http.RoundTripper {
	tb.Helper()
	cfg := transport.Config{Base: okBase{}, Policies: policy.Set{Retry: &policy.Retry{}}, Observer: obs}
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

// TestObserverAllocs: with no span in the request's context, a call
// through a transport with the oteltrace Observer allocates no more than
// one without an observer.
func TestObserverAllocs(t *testing.T) {
	req, _ := http.NewRequest(http.MethodGet, "http://a.test/", nil)
	var allocs [2]float64
	for i, obs := range []*policy.Observer{nil, oteltrace.New()} {
		rt := traced(t, obs)
		roundTrip(t, rt, req) // warm the key
		allocs[i] = testing.AllocsPerRun(200, func() { roundTrip(t, rt, req) })
	}
	if allocs[1] > allocs[0] {
		t.Errorf("a call allocates %v times with the oteltrace observer and no span, %v without an observer", allocs[1], allocs[0])
	}
}

// noop has the funcs oteltrace sets, doing nothing: what the transport
// spends on reporting to such an Observer (it times each attempt and the
// call), apart from what the funcs do.
var noop = &policy.Observer{
	CallDone:        func(policy.CallInfo) {},
	AttemptDone:     func(policy.AttemptInfo) {},
	Refused:         func(policy.Refusal) {},
	RetrySkipped:    func(policy.RetrySkip) {},
	HedgeStarted:    func(policy.HedgeInfo) {},
	HedgeWon:        func(policy.HedgeInfo) {},
	HedgeSuppressed: func(policy.HedgeSuppression) {},
}

// BenchmarkObserverCost is one successful unhedged call with no observer,
// with an Observer whose funcs do nothing, and with the oteltrace Observer
// and no span, or a recording one (which gets one event, the attempt's,
// until the SDK's limit of 128 per span).
func BenchmarkObserverCost(b *testing.B) {
	tp := sdktrace.NewTracerProvider() // records, exports nothing
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("bench").Start(context.Background(), "GET")
	defer span.End()
	for _, bc := range []struct {
		name string
		obs  *policy.Observer
		ctx  context.Context
	}{
		{"nil", nil, context.Background()},
		{"noop", noop, context.Background()},
		{"no-span", oteltrace.New(), context.Background()},
		{"recording", oteltrace.New(), ctx},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rt := traced(b, bc.obs)
			req, _ := http.NewRequestWithContext(bc.ctx, http.MethodGet, "http://a.test/", nil)
			b.ReportAllocs()
			for b.Loop() {
				roundTrip(b, rt, req)
			}
		})
	}
}
