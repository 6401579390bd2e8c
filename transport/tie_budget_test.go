package transport

import (
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
)

// lateTie serves tied requests. A call's first leg waits queue in a
// queue before it starts, and every later leg of the call twinQueue;
// each leg, once started, runs for late before it says so, and is
// answered service after it started. It counts the legs that started.
type lateTie struct {
	late, service time.Duration
	queue         atomic.Int64 // a call's first leg's wait, in nanoseconds
	twinQueue     atomic.Int64 // a call's later legs' wait, in nanoseconds
	mu            sync.Mutex
	legs          map[string]int // legs that came, by call
	ran           atomic.Int64
}

func newLateTie(late, service time.Duration) *lateTie {
	return &lateTie{late: late, service: service, legs: map[string]int{}}
}

func (s *lateTie) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	id := req.Header.Get("X-Call")
	s.mu.Lock()
	s.legs[id]++
	first := s.legs[id] == 1
	s.mu.Unlock()
	wait := func(d time.Duration) bool {
		if d <= 0 {
			return req.Context().Err() == nil
		}
		select {
		case <-time.After(d):
			return true
		case <-req.Context().Done():
			return false
		}
	}
	q := s.twinQueue.Load()
	if first {
		q = s.queue.Load()
	}
	if !wait(time.Duration(q)) {
		return
	}
	s.ran.Add(1)
	if !wait(s.late) {
		return
	}
	if req.Header.Get(httpx.TieHeader) == "1" {
		w.Header()[httpx.TieHeader] = []string{httpx.TieStarted}
		w.WriteHeader(http.StatusEarlyHints)
		delete(w.Header(), httpx.TieHeader)
	}
	if !wait(s.service - s.late) {
		return
	}
	io.WriteString(w, "ok")
}

// lateTieTransport returns a transport with the default budget over four
// replicas all served by srv, warmed by 100 calls that wait in no queue,
// so that the key has learned its ties' delay: twice srv.late.
func lateTieTransport(t *testing.T, srv *lateTie, obs *policy.Observer) *Transport {
	f := newFleet()
	for _, a := range four {
		f.net.Listen(a, srv)
	}
	set := tiedSet()
	set.Budget = policy.Budget{} // the default: an allowance of 10 hedges, 0.1 a call
	rt := newLaneTransport(t, f, Config{Policies: set, Observer: obs})
	prime(t, rt, "http://api/")
	for i := range 100 {
		laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
	}
	delay, ok := rt.scopes.lookup("api").hedge.Ties().Delay(time.Now())
	if !ok || delay != 2*srv.late {
		t.Fatalf("ties' delay %v (%v), want twice the signal's %v", delay, ok, srv.late)
	}
	synctest.Wait()
	return rt
}

// TestTiedTwinsThatAllStartAreBoundedByTheBudget: against servers that
// start every leg before the first leg's signal can cancel its twin,
// every twin runs, and the budget bounds them as it bounds hedges that
// all lose: the 10 its allowance holds and half of Ratio (0.1) a call.
// A twin cancelled sooner after it was sent than its own signal would
// have taken keeps its token.
func TestTiedTwinsThatAllStartAreBoundedByTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const late = 2 * time.Millisecond
		srv := newLateTie(late, 10*late)
		var ev tieEvents
		rt := lateTieTransport(t, srv, ev.observer())
		ranBefore, tiedBefore := srv.ran.Load(), ev.tiedSent.Load()

		// A first leg now waits 1.5× the signal's time before it starts:
		// its twin goes out at twice, and starts at once; the first
		// leg's signal comes half a signal's time later, before the
		// twin's.
		srv.queue.Store(int64(3 * late / 2))
		const calls = 300
		for i := range calls {
			if code, err := laneGet(t, rt, "http://api/", "c"+strconv.Itoa(i)); err != nil || code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, err)
			}
		}
		synctest.Wait()
		twice := srv.ran.Load() - ranBefore - calls
		tied := ev.tiedSent.Load() - tiedBefore
		bound := 10 + calls/10 + 2
		t.Logf("%d calls: %d twins, %d cancelled, %d ran twice (the bound: %d)", calls, tied, ev.cancelled.Load(), twice, bound)
		if tied < 11 {
			t.Fatalf("%d twins: the test sends too few to bound", tied)
		}
		if twice > int64(bound) {
			t.Errorf("%d of %d calls ran twice, want at most %d: the allowance's 10 and 0.1 a call", twice, calls, bound)
		}
	})
}

// TestTiedTwinsCancelledInTheirQueueGiveTheirTokenBack: a twin that waits
// in its server's queue and is cancelled once its first leg starts, late
// enough that its own signal would have come had it started, gives its
// budget token back: every call sends its twin, none is refused by the
// budget, and none runs twice.
func TestTiedTwinsCancelledInTheirQueueGiveTheirTokenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const late = 2 * time.Millisecond
		srv := newLateTie(late, 10*late)
		var ev tieEvents
		var refused atomic.Int64
		obs := ev.observer()
		obs.HedgeSuppressed = func(h policy.HedgeSuppression) {
			if h.Reason == policy.HedgeBudget {
				refused.Add(1)
			}
		}
		rt := lateTieTransport(t, srv, obs)
		ranBefore, tiedBefore := srv.ran.Load(), ev.tiedSent.Load()

		// A first leg waits twice the ties' delay: its twin goes out at
		// the delay and waits longer than the call takes, and the first
		// leg's signal comes 1.5 delays after the twin was sent.
		srv.queue.Store(int64(4 * late))
		srv.twinQueue.Store(int64(100 * late))
		const calls = 300
		for i := range calls {
			if code, err := laneGet(t, rt, "http://api/", "c"+strconv.Itoa(i)); err != nil || code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, err)
			}
		}
		synctest.Wait()
		ran, tied := srv.ran.Load()-ranBefore, ev.tiedSent.Load()-tiedBefore
		t.Logf("%d calls: %d twins, %d cancelled, %d refused by the budget, %d handler runs", calls, tied, ev.cancelled.Load(), refused.Load(), ran)
		if n := refused.Load(); n != 0 {
			t.Errorf("the budget refused %d twins cancelled in their queues", n)
		}
		if tied != calls {
			t.Errorf("%d twins for %d calls whose first legs waited, want one each", tied, calls)
		}
		if ran != calls {
			t.Errorf("%d handler runs for %d calls, want one each", ran, calls)
		}
	})
}
