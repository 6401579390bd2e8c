package oteltrace_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/oteltrace"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// firstFails answers 503 to the first arrival of each call (its X-Call
// header) anywhere in the fleet, and 200 to the rest, so that every call
// is retried once, and its retry goes to a lane it has not used.
type firstFails struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (f *firstFails) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		first := !f.seen[r.Header.Get("X-Call")]
		f.seen[r.Header.Get("X-Call")] = true
		f.mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
}

// held is a Resolver whose first answer waits for answer to be closed.
type held struct {
	policy.Resolver
	answer chan struct{}
}

func (h *held) Resolve(ctx context.Context, hostport string) ([]string, error) {
	<-h.answer
	return h.Resolver.Resolve(ctx, hostport)
}

// TestLaneOnAttempts drives keys with Endpoints lanes, connection lanes
// and none, each call under a span of its own, and checks resilix.lane on
// every attempt's event: the replica's address, the connection lane's
// index, 0 for the lane that dials the request's own address before
// Endpoints answers, and nothing without Replicas; a call's retry is on
// another lane than its first attempt.
func TestLaneOnAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, rec := recorder(t)
		f := &firstFails{seen: map[string]bool{}}
		var net httptestutil.Network
		for _, addr := range []string{"api:80", "a:80", "b:80", "c:80", "conn:80", "plain:80"} {
			net.Listen(addr, f.handler())
		}
		endpoints := &held{Resolver: transport.Static("a:80", "b:80", "c:80"), answer: make(chan struct{})}
		retry := policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}, Budget: policy.Budget{Ratio: -1}}
		withLanes := func(r policy.Replicas) policy.Set {
			s := retry
			r.MaxEjected = -1 // every lane fails half its attempts: keep them all
			s.Replicas = &r
			return s
		}
		tr, err := transport.New(transport.Config{
			Base:     net.Transport(),
			Policies: retry,
			PerKey: map[string]policy.Set{
				"api":  withLanes(policy.Replicas{Endpoints: endpoints}),
				"conn": withLanes(policy.Replicas{Connections: 2}),
			},
			Observer: oteltrace.New(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		defer tr.CloseIdleConnections()

		call := func(host string, i int) string {
			name := fmt.Sprintf("%s #%d", host, i)
			ctx, span := tp.Tracer("test").Start(context.Background(), name)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/", nil)
			req.Header.Set("X-Call", name)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: status %d", name, resp.StatusCode)
			}
			span.End()
			return name
		}
		call("api", 0) // before Endpoints answers: the request's own address
		close(endpoints.answer)
		synctest.Wait()
		for i := 1; i <= 20; i++ {
			call("api", i)
			call("conn", i)
			call("plain", i)
			time.Sleep(10 * time.Millisecond)
		}
		// The lanes of each span's attempt events, in order, "-" for an
		// event without resilix.lane.
		lanes := map[string][]string{}
		for _, s := range rec.Ended() {
			for _, e := range s.Events() {
				if e.Name != "resilix.attempt" {
					continue
				}
				lane, attrs := "-", attribute.NewSet(e.Attributes...)
				if v, ok := attrs.Value("resilix.lane"); ok {
					lane = v.AsString()
				}
				lanes[s.Name()] = append(lanes[s.Name()], lane)
			}
		}

		if got := lanes["api #0"]; len(got) != 2 || got[0] != "0" || got[1] != "0" {
			// One lane until Endpoints answers: the retry reuses it.
			t.Errorf("api #0, before Endpoints answered: attempts on lanes %v, want [0 0]", got)
		}
		want := map[string][]string{"api": {"a:80", "b:80", "c:80"}, "conn": {"0", "1"}, "plain": {"-"}}
		used := map[string]map[string]bool{}
		for name, got := range lanes {
			host, _, _ := strings.Cut(name, " ")
			if name == "api #0" {
				continue
			}
			if len(got) != 2 {
				t.Errorf("%s: %d attempts, want 2 (a failure, then a retry)", name, len(got))
				continue
			}
			for _, l := range got {
				if !slices.Contains(want[host], l) {
					t.Errorf("%s: an attempt on lane %q, want one of %v", name, l, want[host])
				}
				if used[host] == nil {
					used[host] = map[string]bool{}
				}
				used[host][l] = true
			}
			if host != "plain" && got[0] == got[1] {
				t.Errorf("%s: the retry went to lane %s again", name, got[1])
			}
		}
		for host, ls := range want {
			if len(used[host]) != len(ls) {
				t.Errorf("%s: attempts on lanes %v, want every one of %v", host, used[host], ls)
			}
		}
		if len(lanes) != 61 {
			t.Errorf("%d spans with attempts, want 61", len(lanes))
		}
	})
}

// slowFirst answers the first arrival of each call (its X-Call header)
// anywhere in the fleet after slow, the rest after 1ms.
type slowFirst struct {
	mu   sync.Mutex
	seen map[string]bool
	slow time.Duration
}

func (f *slowFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	d := time.Millisecond
	if id := r.Header.Get("X-Call"); id != "" && !f.seen[id] {
		f.seen[id] = true
		d = f.slow
	}
	f.mu.Unlock()
	select {
	case <-time.After(d):
	case <-r.Context().Done():
	}
}

// TestLaneOnHedges: a call whose first leg is slow is hedged, the hedge
// goes to the other lane and wins, and the first leg, discarded while on
// the wire and reported by the goroutine that decided the round, names
// its own lane.
func TestLaneOnHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, rec := recorder(t)
		var net httptestutil.Network
		h := &slowFirst{seen: map[string]bool{}, slow: time.Millisecond}
		for _, addr := range []string{"api:80", "a:80", "b:80"} {
			net.Listen(addr, h)
		}
		tr, err := transport.New(transport.Config{
			Base: net.Transport(),
			Policies: policy.Set{
				Attempts: 2,
				Budget:   policy.Budget{Ratio: -1},
				Hedge:    &policy.Hedge{Quantile: 0.5, MaxConcurrent: 2},
				Replicas: &policy.Replicas{Endpoints: transport.Static("a:80", "b:80")},
			},
			Observer: oteltrace.New(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		defer tr.CloseIdleConnections()
		call := func(name string) {
			ctx, span := tp.Tracer("test").Start(context.Background(), name)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api/", nil)
			req.Header.Set("X-Call", name)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			synctest.Wait() // the loser is reported before the span ends
			span.End()
		}
		call("prime") // starts the refresh of Endpoints
		for i := range 100 {
			call(fmt.Sprint("warm ", i)) // 1ms each: the hedge's threshold
		}
		h.mu.Lock()
		h.slow = 100 * time.Millisecond
		h.mu.Unlock()
		for i := range 20 {
			call(fmt.Sprint("hedged ", i))
		}

		hedged := 0
		for _, s := range rec.Ended() {
			if !strings.HasPrefix(s.Name(), "hedged ") {
				continue
			}
			lanes := map[string]string{} // by kind/outcome
			for _, e := range s.Events() {
				if e.Name != "resilix.attempt" {
					continue
				}
				attrs := attribute.NewSet(e.Attributes...)
				kind, _ := attrs.Value("resilix.attempt.kind")
				outcome, _ := attrs.Value("resilix.attempt.outcome")
				lane, _ := attrs.Value("resilix.lane")
				lanes[kind.AsString()+" "+outcome.AsString()] = lane.AsString()
			}
			won, lost := lanes["hedge success"], lanes["first discarded"]
			if won == "" && lost == "" {
				continue // not hedged
			}
			hedged++
			if !slices.Contains([]string{"a:80", "b:80"}, won) || !slices.Contains([]string{"a:80", "b:80"}, lost) || won == lost {
				t.Errorf("%s: the hedge won on lane %q, the first leg lost on %q; want a:80 and b:80", s.Name(), won, lost)
			}
		}
		if hedged < 15 {
			t.Errorf("%d of 20 calls slow on their first leg were hedged, want nearly all", hedged)
		}
	})
}
