package transport

import (
	"errors"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestAStallOfTheClientEjectsNoLane: the client's own process stalls for
// 300 ms (a GC pause, CPU starvation, a SIGSTOP) while 40 callers keep
// four connection lanes busy, with a per-attempt timeout of 100 ms. The
// stall is played by the base's Proxy func, which every attempt calls
// before it is sent and which holds each attempt that comes to it in the
// stall until the stall ends: the client does nothing meanwhile, and
// then ends every attempt whose deadline passed at once, late, on every
// lane. None of those timeouts is its lane's failure: no lane is ejected
// or taken out, and the replicas answer as before.
func TestAStallOfTheClientEjectsNoLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "a", "b", "c", "d")
		for _, r := range f.reps {
			r.delay.Store(int64(10 * time.Millisecond))
		}
		var stall atomic.Pointer[chan struct{}]
		base := f.net.Transport()
		base.Proxy = func(*http.Request) (*url.URL, error) {
			if c := stall.Load(); c != nil {
				<-*c
			}
			return nil, nil
		}
		var ejected atomic.Int64
		rt, err := New(Config{
			Base: base,
			Policies: policy.Set{
				Timeout:  &policy.Timeout{PerAttempt: 100 * time.Millisecond},
				Replicas: &policy.Replicas{},
			},
			Observer: &policy.Observer{LaneEjected: func(policy.LaneEjection) { ejected.Add(1) }},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			rt.CloseIdleConnections()
			f.net.Close()
		})
		var stop atomic.Bool
		var timeouts, failed atomic.Int64
		var wg sync.WaitGroup
		for range 40 {
			wg.Go(func() {
				for !stop.Load() {
					code, err := laneGet(t, rt, "http://api/", "")
					switch {
					case errors.Is(err, policy.ErrAttemptTimeout):
						timeouts.Add(1)
					case err != nil || code != 200:
						failed.Add(1)
					}
				}
			})
		}
		time.Sleep(100 * time.Millisecond)
		c := make(chan struct{})
		stall.Store(&c)
		time.Sleep(300 * time.Millisecond)
		stall.Store(nil)
		close(c)
		synctest.Wait()
		var lanes [policy.MaxLanes]policy.LaneSnapshot
		rt.scopes.lookup("api").lanes.States(time.Now(), &lanes)
		for i, ls := range lanes[:4] {
			if ls.State == policy.LaneEjected || ls.State == policy.LaneDown {
				t.Errorf("lane %d is %v after the client's stall, want it open", i, ls.State)
			}
		}
		time.Sleep(100 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		if n := timeouts.Load(); n < 20 {
			t.Fatalf("%d calls timed out in the stall, want about 40: the stall played no part", n)
		}
		if n := ejected.Load(); n != 0 {
			t.Errorf("%d lanes ejected after a stall of the client ended %d attempts at their timeout", n, timeouts.Load())
		}
		if n := failed.Load(); n != 0 {
			t.Errorf("%d calls failed otherwise than by the stall's timeouts", n)
		}
	})
}

// TestAHungReplicaIsStillEjected: one replica of four takes every attempt
// and says nothing, while the others answer in 2 ms: its attempts end at
// their 100 ms timeout, on time, and five of them in a row eject its lane.
func TestAHungReplicaIsStillEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.serveFour()
		for _, r := range f.reps {
			r.delay.Store(int64(2 * time.Millisecond))
		}
		f.reps["d"].delay.Store(int64(time.Hour))
		var mu sync.Mutex
		var ejections []policy.LaneEjection
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Timeout:  &policy.Timeout{PerAttempt: 100 * time.Millisecond},
				Replicas: &policy.Replicas{Endpoints: Static(four...)},
			},
			Observer: &policy.Observer{LaneEjected: func(e policy.LaneEjection) {
				mu.Lock()
				defer mu.Unlock()
				ejections = append(ejections, e)
			}},
		})
		prime(t, rt, "http://api/")
		var wg sync.WaitGroup
		for range 800 { // 8 s, a call every 10 ms
			time.Sleep(10 * time.Millisecond)
			wg.Go(func() { laneGet(t, rt, "http://api/", "") })
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(ejections) != 1 || ejections[0].Addr != "d:80" || ejections[0].Reason != policy.EjectConsecutive {
			t.Errorf("ejections %+v, want d:80's lane, for its failures in a row", ejections)
		}
	})
}
