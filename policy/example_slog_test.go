package policy_test

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
	"github.com/resilix/resilix/transport"
)

// slogObserver logs what resilix does beyond sending each call once:
// failed and repeated attempts, skipped retries, hedges and refusals. Each
// record is logged with the event's Context, the caller's request context,
// so a handler that correlates logs with traces (one that reads the span
// from the context) ties every line to its request. A call whose first
// attempt succeeds logs nothing.
func slogObserver(log *slog.Logger) *policy.Observer {
	return &policy.Observer{
		AttemptDone: func(a policy.AttemptInfo) {
			level, msg := slog.LevelInfo, ""
			switch {
			case a.Outcome == policy.Failure:
				level, msg = slog.LevelWarn, "attempt failed"
			case a.Outcome == policy.Discarded:
				msg = "attempt discarded"
			case a.Outcome == policy.Success && a.Kind != policy.AttemptFirst:
				msg = "attempt succeeded"
			default: // the first attempt succeeded, or the caller gave up
				return
			}
			attrs := []any{"key", a.Key, "attempt", a.Attempt, "kind", a.Kind}
			if a.StatusCode != 0 {
				attrs = append(attrs, "status", a.StatusCode)
			}
			if a.Err != nil {
				attrs = append(attrs, "err", a.Err)
			}
			log.Log(a.Context, level, msg, attrs...)
		},
		RetrySkipped: func(s policy.RetrySkip) {
			attrs := []any{"key", s.Key, "attempt", s.Attempt, "reason", s.Reason}
			if s.Reason == policy.SkipGate {
				attrs = append(attrs, "gate", s.Gate)
			}
			log.WarnContext(s.Context, "retry skipped", attrs...)
		},
		HedgeStarted: func(h policy.HedgeInfo) {
			log.InfoContext(h.Context, "hedge sent", "key", h.Key, "attempt", h.Attempt, "threshold", h.Threshold)
		},
		HedgeWon: func(h policy.HedgeInfo) {
			log.InfoContext(h.Context, "hedge won", "key", h.Key, "attempt", h.Attempt)
		},
		HedgeSuppressed: func(h policy.HedgeSuppression) {
			// Routine (a window still warming, a spent budget): debug.
			log.DebugContext(h.Context, "hedge suppressed", "key", h.Key, "reason", h.Reason)
		},
		Refused: func(r policy.Refusal) {
			log.WarnContext(r.Context, "refused", "key", r.Key, "kind", r.Kind, "gate", r.Gate, "priority", r.Priority)
		},
	}
}

type requestIDKey struct{}

// requestIDs adds the request id the context carries to every record: a
// stand-in, here, for a handler with trace correlation, which adds the
// trace and span ids of the span in the context.
type requestIDs struct{ slog.Handler }

func (h requestIDs) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := ctx.Value(requestIDKey{}).(string); ok {
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

// Logging retries, hedges and refusals with log/slog, each line with its
// request's context.
func ExampleObserver_slog() {
	log := slog.New(requestIDs{slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "threshold" { // they vary from run to run
				return slog.Attr{}
			}
			return a
		},
	})})

	// The upstreams, in memory. inventory fails every POST, and GETs
	// twice before it recovers. catalog answers in 10ms, but its sixth
	// request is slower: it waits for the hedge sent after it, then
	// answers first.
	var inventory, catalog atomic.Int32
	hedgeIn := make(chan struct{})
	upstream := httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Host {
		case "inventory.internal":
			if r.Method == http.MethodPost || inventory.Add(1) <= 2 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "catalog.internal":
			switch catalog.Add(1) {
			case 6: // slow: answers once the hedge is on the wire
				<-hedgeIn
			case 7: // the hedge: stays until it is cancelled
				close(hedgeIn)
				<-r.Context().Done()
			default:
				time.Sleep(10 * time.Millisecond)
			}
		}
	}))

	rt, err := transport.New(transport.Config{
		Base:     upstream,
		Policies: policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}},
		PerKey: map[string]policy.Set{
			"catalog.internal": {Hedge: &policy.Hedge{MinSamples: 5}},
			"search.internal":  {RateLimit: &policy.RateLimit{PerSecond: 0.001, Burst: 1}},
		},
		Observer: slogObserver(log),
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}
	var id int
	call := func(method, url string) {
		id++
		ctx := context.WithValue(context.Background(), requestIDKey{}, fmt.Sprint("req-", id))
		req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader("{}"))
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}

	call(http.MethodGet, "http://inventory.internal/items/42") // retried twice
	call(http.MethodPost, "http://inventory.internal/orders")  // a POST is not retried
	for range 6 {
		call(http.MethodGet, "http://catalog.internal/") // the sixth is hedged
	}
	call(http.MethodGet, "http://search.internal/?q=a")
	call(http.MethodGet, "http://search.internal/?q=b") // over the rate limit
	// Output:
	// level=WARN msg="attempt failed" key=inventory.internal attempt=1 kind=first status=503 request_id=req-1
	// level=WARN msg="attempt failed" key=inventory.internal attempt=2 kind=retry status=503 request_id=req-1
	// level=INFO msg="attempt succeeded" key=inventory.internal attempt=3 kind=retry status=200 request_id=req-1
	// level=WARN msg="attempt failed" key=inventory.internal attempt=1 kind=first status=503 request_id=req-2
	// level=WARN msg="retry skipped" key=inventory.internal attempt=1 reason=not_replayable request_id=req-2
	// level=INFO msg="hedge sent" key=catalog.internal attempt=2 request_id=req-8
	// level=INFO msg="attempt discarded" key=catalog.internal attempt=2 kind=hedge request_id=req-8
	// level=WARN msg=refused key=search.internal kind=first gate=rate_limit priority=critical request_id=req-10
}
