package transport

import (
	"context"
	"errors"
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

// TestTheFirstCallsReachANameOnlyEndpointsKnows: a key whose host only
// its Endpoints can resolve (a cluster's DNS server), asked by no other
// resolver, answers its first calls, which go out before Endpoints'
// first answer is in: the lane to the request's own address, failing to
// dial it, dials the addresses Endpoints gives.
func TestTheFirstCallsReachANameOnlyEndpointsKnows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("a:80", "a")
		f.serve("b:80", "b")
		release := make(chan struct{})
		answer := sync.OnceFunc(func() { close(release) })
		defer answer()
		// The refresh's question (its context ends after Refresh, an
		// hour; the calls' have no deadline) waits, so that the first
		// calls are all before the first answer; the dials' are answered.
		ends := resolverFunc(func(ctx context.Context, hp string) ([]string, error) {
			if hp != "api:80" {
				return nil, errors.New("unknown")
			}
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) > 59*time.Minute {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return []string{"nowhere:80", "a:80", "b:80"}, nil
		})
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: ends, Refresh: time.Hour}}})
		for i := range 5 {
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != http.StatusOK {
				t.Fatalf("call %d before Endpoints' first answer: %d, %v", i, code, err)
			}
		}
		if got := f.hits("a", "b"); got[0] == 0 || got[1] != 0 {
			t.Errorf("the first calls reached a, b %v times, want a, the first address that answers", got)
		}
		answer()
		synctest.Wait()
		if m := rt.Measured("api"); m.Lanes != 3 {
			t.Errorf("%d lanes after the first answer, want 3", m.Lanes)
		}
	})
}

// TestTheFirstCallsDialTheirOwnAddressFirst: until Endpoints answers, a
// name the base's dialer reaches is dialed as it is, and Endpoints is
// not asked by the dial.
func TestTheFirstCallsDialTheirOwnAddressFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.serve("a:80", "a")
		var asked atomic.Int64
		release := make(chan struct{})
		answer := sync.OnceFunc(func() { close(release) })
		defer answer()
		ends := resolverFunc(func(ctx context.Context, _ string) ([]string, error) {
			asked.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return []string{"a:80"}, nil
		})
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: ends}}})
		for range 3 {
			if code, err := laneGet(t, rt, "http://api/", ""); err != nil || code != http.StatusOK {
				t.Fatalf("%d, %v", code, err)
			}
		}
		if got := f.hits("own", "a"); !slices.Equal(got, []int64{3, 0}) || asked.Load() != 1 {
			t.Errorf("own, a got %v calls with Endpoints asked %d times, want 3, 0 and once (the refresh)", got, asked.Load())
		}
		answer()
		synctest.Wait()
	})
}

func TestDNSWithResolvesThroughItsResolver(t *testing.T) {
	var dialed atomic.Int64
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		dialed.Add(1)
		return nil, errors.New("no DNS server here")
	}}
	if _, err := DNSWith(r).Resolve(context.Background(), "replicas.test:8080"); err == nil || dialed.Load() == 0 {
		t.Errorf("DNSWith(r) answered (err %v) without asking r's DNS server (%d dials)", err, dialed.Load())
	}
	addrs, err := DNSWith(r).Resolve(context.Background(), "127.0.0.1:8080")
	if err != nil || !slices.Equal(addrs, []string{"127.0.0.1:8080"}) {
		t.Errorf("DNSWith(r) of an IP: %v, %v, want it as it is", addrs, err)
	}
}
