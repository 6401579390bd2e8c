package transport

import (
	"context"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

func TestABreakerSeesAHostShrunkToEjectedLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Four dead replicas, two of them ejected; then Endpoints answers
		// only those two.
		f := newFleet()
		f.serve("api:80", "own")
		f.serveFour()
		var addrs atomic.Value
		addrs.Store(four)
		res := resolverFunc(func(context.Context, string) ([]string, error) {
			return slices.Clone(addrs.Load().([]string)), nil
		})
		var mu sync.Mutex
		var ejected []string
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Attempts: 4,
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Breaker:  &policy.Breaker{},
				Replicas: &policy.Replicas{Endpoints: res, Refresh: 5 * time.Second, ConsecutiveFailures: 1},
			},
			Observer: &policy.Observer{LaneEjected: func(e policy.LaneEjection) {
				mu.Lock()
				defer mu.Unlock()
				ejected = append(ejected, e.Addr)
			}},
		})
		prime(t, rt, "http://api/")
		for _, r := range f.reps {
			r.status.Store(http.StatusInternalServerError)
		}
		laneGet(t, rt, "http://api/", "")
		if len(ejected) != 2 {
			t.Fatalf("ejected %q, want two of four", ejected)
		}
		addrs.Store(slices.Clone(ejected))
		time.Sleep(6 * time.Second) // past Refresh
		laneGet(t, rt, "http://api/", "")
		synctest.Wait()
		if m := rt.Measured("api"); m.Lanes != 2 || m.LanesEjected != 1 {
			t.Errorf("after the set shrank: %d lanes, %d ejected, want 2 and 1", m.Lanes, m.LanesEjected)
		}
		var before int64
		for _, n := range f.hits("a", "b", "c", "d") {
			before += n
		}
		for range 1000 { // 10 s, within the ejection
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
		}
		var hits int64
		for _, n := range f.hits("a", "b", "c", "d") {
			hits += n
		}
		// The breaker opens, and each half-open probe's failure opens it
		// again: a few probe rounds reach the dead host in 10 s.
		if hits -= before; hits > 100 {
			t.Errorf("a dead host got %d attempts of 1000 calls over 10s: its breaker is blind", hits)
		}
	})
}

func TestARefusedDialTakesItsLaneOutAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.serve("a:80", "a")
		f.serve("b:80", "b") // c:80 is not there: its dials are refused
		var mu sync.Mutex
		dials := map[string]int{}
		base := f.net.Transport()
		base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials[addr]++
			mu.Unlock()
			return f.net.DialContext(ctx, network, addr)
		}
		rt, err := New(Config{
			Base: base,
			Policies: policy.Set{
				Attempts: 3,
				Retry:    &policy.Retry{BaseDelay: time.Millisecond},
				Replicas: &policy.Replicas{Endpoints: Static("a:80", "b:80", "c:80")},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rt.CloseIdleConnections()
			f.net.Close()
		})
		prime(t, rt, "http://api/")
		failed := 0
		for range 500 { // 5 s
			time.Sleep(10 * time.Millisecond)
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != 200 {
				failed++
			}
		}
		mu.Lock()
		refused := dials["c:80"]
		mu.Unlock()
		if failed != 0 {
			t.Errorf("%d of 500 calls failed with one replica of three not there", failed)
		}
		// One probe a second, at most, and the first attempt.
		if refused > 7 {
			t.Errorf("%d dials to the replica not there in 5s, want at most one a second", refused)
		}
		if m := rt.Measured("api"); m.LanesEjected != 0 {
			t.Errorf("%d lanes ejected by refused dials, want none", m.LanesEjected)
		}
		// It listens again: back within a second, and its share within
		// three.
		f.serve("c:80", "c")
		for range 300 {
			time.Sleep(10 * time.Millisecond)
			laneGet(t, rt, "http://api/", "")
		}
		if n := f.reps["c"].hits.Load(); n < 300/3/2 {
			t.Errorf("the replica back got %d of 300 calls over 3s, want at least half its share", n)
		}
	})
}
