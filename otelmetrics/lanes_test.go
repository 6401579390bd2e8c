package otelmetrics_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// held is a Resolver whose answer waits for answer to be closed.
type held struct {
	policy.Resolver
	answer chan struct{}
}

func (h *held) Resolve(ctx context.Context, hostport string) ([]string, error) {
	<-h.answer
	return h.Resolver.Resolve(ctx, hostport)
}

// status answers every request with its code.
type status int

func (s status) ServeHTTP(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(int(s)) }

// TestLanes drives a key whose four replicas all fail, so that each
// failure ejects its lane until half of them are (ConsecutiveFailures 1,
// MaxEjected 0.5), a key with two healthy connection lanes, and a key
// without lanes, and checks resilix.ejections against the LaneEjected
// events and resilix.lanes against the transport's snapshot, with no
// lane's address in any attribute.
func TestLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader, obs := newObserver(t)
		var net httptestutil.Network
		net.Listen("api:80", status(http.StatusOK)) // the request's own address, until Endpoints answers
		replicas := []string{"a:80", "b:80", "c:80", "d:80"}
		for _, a := range replicas {
			net.Listen(a, status(http.StatusServiceUnavailable))
		}
		net.Listen("conn:80", status(http.StatusOK))
		net.Listen("plain:80", status(http.StatusOK))
		endpoints := &held{Resolver: transport.Static(replicas...), answer: make(chan struct{})}

		var ejected atomic.Int64 // LaneEjected events, all with reason consecutive
		tee := *obs
		tee.LaneEjected = func(e policy.LaneEjection) {
			if e.Reason == policy.EjectConsecutive && e.Key == "api" {
				ejected.Add(1)
			}
			obs.LaneEjected(e)
		}
		retry := policy.Set{Retry: &policy.Retry{BaseDelay: time.Millisecond}, Budget: policy.Budget{Ratio: -1}, Breaker: &policy.Breaker{}}
		withLanes := func(r policy.Replicas) policy.Set {
			s := retry
			s.Replicas = &r
			return s
		}
		tr, err := transport.New(transport.Config{
			Base:     net.Transport(),
			Policies: retry,
			PerKey: map[string]policy.Set{
				"api":  withLanes(policy.Replicas{Endpoints: endpoints, ConsecutiveFailures: 1}),
				"conn": withLanes(policy.Replicas{Connections: 2}),
			},
			Observer: &tee,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer net.Close()
		defer tr.CloseIdleConnections()
		get := func(host string) int {
			req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", host, err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		get("api") // on the request's own address: Endpoints has not answered
		close(endpoints.answer)
		synctest.Wait()
		// Three attempts on three lanes: the first two failures eject
		// their lanes, the third finds half of the four ejected.
		if code := get("api"); code != http.StatusServiceUnavailable {
			t.Fatalf("api: status %d, want 503 from every replica", code)
		}
		for range 4 {
			get("conn")
			get("plain")
		}

		got := map[string]float64{}
		for k, v := range collect(t, reader).values {
			if strings.Contains(k, ":80") {
				t.Errorf("%s names a lane", k)
			}
			if strings.HasPrefix(k, "resilix.lanes{") || strings.HasPrefix(k, "resilix.ejections{") {
				got[k] = v
			}
		}
		api, conn := tr.Measured("api"), tr.Measured("conn")
		if !api.HasReplicas || api.Lanes != 4 || api.LanesEjected != 2 || ejected.Load() != 2 {
			t.Fatalf("api: %d lanes, %d ejected (%d events); want 4, 2 (2)", api.Lanes, api.LanesEjected, ejected.Load())
		}
		want := map[string]float64{
			"resilix.ejections{key=api,reason=consecutive}": float64(ejected.Load()),
			"resilix.lanes{key=api,state=open}":             float64(api.Lanes - api.LanesEjected),
			"resilix.lanes{key=api,state=ejected}":          float64(api.LanesEjected),
			"resilix.lanes{key=conn,state=open}":            float64(conn.Lanes),
			"resilix.lanes{key=conn,state=ejected}":         0,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("resilix.lanes and resilix.ejections (-want +got):\n%s", diff)
		}
		if conn.Lanes != 2 {
			t.Errorf("conn: %d lanes, want 2", conn.Lanes)
		}
	})
}

// TestLaneEjectedAllocatesNothing: once its key's attributes are cached, an
// ejection is counted without allocating.
func TestLaneEjectedAllocatesNothing(t *testing.T) {
	_, obs := newObserver(t)
	e := policy.LaneEjection{Context: t.Context(), Key: "api", Addr: "10.0.0.7:443", Index: 3, Reason: policy.EjectRate, For: time.Minute}
	obs.LaneEjected(e)
	if n := testing.AllocsPerRun(200, func() { obs.LaneEjected(e) }); n != 0 {
		t.Errorf("a warm LaneEjected allocates %v times, want 0", n)
	}
}
