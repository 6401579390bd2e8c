package otelmetrics_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/attempt"
	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// TestRepeatsAndMalformedHeaders checks the two counters of what the
// transport tolerates: calls sent once because they were themselves a
// repeat (resilix.repeats.sent_once, read from the snapshot), and headers
// that could not be parsed (resilix.headers.malformed, by header name).
func TestRepeatsAndMalformedHeaders(t *testing.T) {
	reader, obs := newObserver(t)
	failing := httptestutil.NewUpstream(httptestutil.Options{Faults: []httptestutil.Fault{{Probability: 1, Status: http.StatusServiceUnavailable}}})
	tr, err := transport.New(transport.Config{
		Base:     hosts{"a.test": httptestutil.InMemory(failing)},
		Policies: policy.Set{Attempts: 3, Retry: &policy.Retry{Delay: func(int) time.Duration { return 0 }}},
		Observer: obs,
	})
	if err != nil {
		t.Fatal(err)
	}
	call := func(ctx context.Context, priority string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://a.test/", nil)
		if priority != "" {
			req.Header.Set("Resilix-Priority", priority)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for range 3 {
		call(attempt.With(t.Context(), 2), "")
	}
	call(t.Context(), "urgent!")
	call(t.Context(), "critical")

	got := map[string]float64{}
	for _, name := range []string{
		"resilix.repeats.sent_once{key=a.test}",
		"resilix.headers.malformed{http.header=Resilix-Priority,key=a.test}",
		"resilix.attempts{key=a.test,kind=retry,outcome=failure}",
	} {
		got[name] = collect(t, reader).values[name]
	}
	want := map[string]float64{
		"resilix.repeats.sent_once{key=a.test}":                              3,
		"resilix.headers.malformed{http.header=Resilix-Priority,key=a.test}": 1,
		"resilix.attempts{key=a.test,kind=retry,outcome=failure}":            4, // the two calls that were not repeats
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
}
