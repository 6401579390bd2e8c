package slogobserver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/slogobserver"
	"github.com/resilix/resilix/transport"
)

// requestIDs adds the request id the context carries to every record: a
// stand-in, here, for a handler with trace correlation, which adds the
// trace and span ids of the span in the context.
type requestIDs struct{ slog.Handler }

type exampleIDKey struct{}

func (h requestIDs) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := ctx.Value(exampleIDKey{}).(string); ok {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDs) WithAttrs(as []slog.Attr) slog.Handler {
	return requestIDs{h.Handler.WithAttrs(as)}
}

func (h requestIDs) WithGroup(name string) slog.Handler {
	return requestIDs{h.Handler.WithGroup(name)}
}

// Logging what resilix does to calls, each line with its request's
// context, to a handler at Debug: retries, a skipped retry, a breaker
// opening, a refusal and a malformed header. At Info, slog's default, the
// breaker's opening alone would be written here, and, after Summary (10s),
// a summary line per key with the counts of the rest.
func Example() {
	logger := slog.New(requestIDs{slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "latency_ms", "retry_after_ms": // they vary from run to run
				return slog.Attr{}
			}
			return a
		},
	})})

	// The upstreams, in memory. inventory fails every POST, and GETs twice
	// before it recovers; billing always fails.
	var inventory atomic.Int32
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Host {
		case "inventory.internal":
			if r.Method == http.MethodPost || inventory.Add(1) <= 2 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "billing.internal":
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))

	rt, err := transport.New(transport.Config{
		Base:     upstream,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
		PerKey: map[string]policy.Set{
			"billing.internal": {
				Retry:   &policy.Retry{BaseDelay: time.Millisecond},
				Breaker: &policy.Breaker{ConsecutiveFailures: 3},
			},
			"search.internal": {RateLimit: &policy.RateLimit{PerSecond: 0.001, Burst: 1}},
		},
		Observer: slogobserver.New(logger, slogobserver.Options{}),
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}
	var id int
	call := func(method, url string, header ...string) {
		id++
		ctx := context.WithValue(context.Background(), exampleIDKey{}, fmt.Sprint("req-", id))
		req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader("{}"))
		if len(header) == 2 {
			req.Header.Set(header[0], header[1])
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}

	call(http.MethodGet, "http://inventory.internal/items/42") // retried twice, then succeeds
	call(http.MethodPost, "http://inventory.internal/orders")  // a POST is not retried
	call(http.MethodGet, "http://billing.internal/invoices")   // three failures open the breaker
	call(http.MethodGet, "http://billing.internal/invoices")   // refused by the open breaker: Debug
	call(http.MethodGet, "http://search.internal/?q=a")
	call(http.MethodGet, "http://search.internal/?q=b") // over the rate limit
	call(http.MethodGet, "http://inventory.internal/items/7", "Resilix-Priority", "urgent")
	// Output:
	// level=DEBUG msg="attempt failed" key=inventory.internal kind=first attempt=1 outcome=failure http.response.status_code=503 request_id=req-1
	// level=DEBUG msg="attempt failed" key=inventory.internal kind=retry attempt=2 outcome=failure http.response.status_code=503 request_id=req-1
	// level=DEBUG msg="attempt failed" key=inventory.internal kind=first attempt=1 outcome=failure http.response.status_code=503 request_id=req-2
	// level=DEBUG msg="retry skipped" key=inventory.internal attempt=1 priority=critical reason=not_replayable request_id=req-2
	// level=DEBUG msg="attempt failed" key=billing.internal kind=first attempt=1 outcome=failure http.response.status_code=500 request_id=req-3
	// level=DEBUG msg="attempt failed" key=billing.internal kind=retry attempt=2 outcome=failure http.response.status_code=500 request_id=req-3
	// level=WARN msg="breaker opened" key=billing.internal from=closed to=open request_id=req-3
	// level=DEBUG msg="attempt failed" key=billing.internal kind=retry attempt=3 outcome=failure http.response.status_code=500 request_id=req-3
	// level=DEBUG msg=refused key=billing.internal kind=first gate=breaker priority=critical tenant.heavy=false request_id=req-4
	// level=DEBUG msg=refused key=search.internal kind=first gate=rate_limit priority=critical tenant.heavy=false request_id=req-6
	// level=DEBUG msg="malformed header" key=inventory.internal http.header=Resilix-Priority value=urgent request_id=req-7
}
