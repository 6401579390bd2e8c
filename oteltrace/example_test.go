package oteltrace_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/oteltrace"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// A call retried twice leaves an event per attempt on the caller's span,
// and the span's resend count. In production the span comes from
// otelhttp.NewTransport wrapped around the resilix transport; here the
// example starts it, on an SDK that records spans in memory.
func Example() {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())

	var calls atomic.Int32
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	rt, err := transport.New(transport.Config{
		Base:     upstream,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
		Observer: oteltrace.New(),
	})
	if err != nil {
		panic(err)
	}

	ctx, span := tp.Tracer("example").Start(context.Background(), "GET")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://inventory.internal/items/42", nil)
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	span.End()

	s := rec.Ended()[0]
	for _, e := range s.Events() {
		fmt.Print(e.Name)
		for _, kv := range e.Attributes {
			switch kv.Key {
			case "resilix.attempt.kind", "resilix.attempt.number", "resilix.attempt.outcome", "http.response.status_code":
				fmt.Printf(" %s=%s", kv.Key, kv.Value.String())
			}
		}
		fmt.Println()
	}
	for _, kv := range s.Attributes() {
		fmt.Printf("span: %s=%s\n", kv.Key, kv.Value.String())
	}
	// Output:
	// resilix.attempt resilix.attempt.kind=first resilix.attempt.number=1 resilix.attempt.outcome=failure http.response.status_code=503
	// resilix.attempt resilix.attempt.kind=retry resilix.attempt.number=2 resilix.attempt.outcome=failure http.response.status_code=503
	// resilix.attempt resilix.attempt.kind=retry resilix.attempt.number=3 resilix.attempt.outcome=success http.response.status_code=200
	// span: http.request.resend_count=2
}
