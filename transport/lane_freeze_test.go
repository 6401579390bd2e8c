package transport

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/lane"
	"github.com/resilix/resilix/policy"
)

// frozenReplica answers after 4 to 6 ms (with tail, one answer in ten
// 8 ms later), except while frozen: then it holds what arrives until it
// thaws (as a SIGSTOPped server's kernel accepts and queues) or its
// request is cancelled.
type frozenReplica struct {
	hits   atomic.Int64
	frozen atomic.Int64 // hits while frozen
	posts  atomic.Int64 // plain POSTs that arrived while frozen
	thaw   atomic.Pointer[chan struct{}]
	tail   bool
	// While watch is set, the first answer to a request that arrived
	// since sets answered (Unix ns).
	watch    atomic.Bool
	answered atomic.Int64
}

func (r *frozenReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	n := r.hits.Add(1)
	watched := r.watch.Load()
	if c := r.thaw.Load(); c != nil {
		r.frozen.Add(1)
		if req.Method == http.MethodPost && req.Header.Get("Idempotency-Key") == "" {
			r.posts.Add(1)
		}
		select {
		case <-*c:
		case <-req.Context().Done():
			return
		}
	}
	d := 4*time.Millisecond + time.Duration(n%5)*500*time.Microsecond
	if r.tail && n%10 == 0 {
		d += 8 * time.Millisecond
	}
	select {
	case <-time.After(d):
	case <-req.Context().Done():
		return
	}
	io.WriteString(w, "ok")
	if watched {
		r.answered.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// TestAFrozenReplicaGetsNoPlainPOST is fleetops' freeze in a bubble: three
// replicas, one frozen for 5 s (nothing answers, nothing is refused), a
// call every 5 ms, open loop: 8 GETs, a plain POST and a POST with an
// Idempotency-Key in every 10, through Attempts 3, Retry, Hedge, Breaker
// and a PerAttempt timeout of 1 s. A plain POST sent to the frozen replica
// fails: it cannot be retried or hedged. The first legs sent there before
// anything was known are lost to their hedges, and say that the lane
// answers nothing: from then until it answers, a call that cannot be sent
// twice is sent to another lane, and the lane draws few calls.
func TestAFrozenReplicaGetsNoPlainPOST(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		reps := map[string]*frozenReplica{}
		for _, a := range []string{"a:80", "b:80", "c:80"} {
			reps[a] = &frozenReplica{}
			f.net.Listen(a, reps[a])
		}
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{},
			Hedge:    &policy.Hedge{},
			Breaker:  &policy.Breaker{},
			Timeout:  &policy.Timeout{PerAttempt: time.Second},
			Replicas: &policy.Replicas{Endpoints: Static("a:80", "b:80", "c:80")},
		}})
		prime(t, rt, "http://api/")
		var wg sync.WaitGroup
		var failed [3]atomic.Int64 // GET, plain POST, keyed POST
		call := func(i int) {
			kind := 0
			switch i % 10 {
			case 4:
				kind = 1
			case 9:
				kind = 2
			}
			method, body := http.MethodGet, ""
			if kind > 0 {
				method, body = http.MethodPost, "x"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, method, "http://api/", strings.NewReader(body))
			if body == "" {
				req.Body = nil
			}
			if kind == 2 {
				req.Header.Set("Idempotency-Key", strconv.Itoa(i))
			}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				failed[kind].Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		run := func(d time.Duration, from int) int {
			n := int(d / (5 * time.Millisecond))
			for i := range n {
				wg.Go(func() { call(from + i) })
				time.Sleep(5 * time.Millisecond)
			}
			return from + n
		}
		i := run(2*time.Second, 0)
		thaw := make(chan struct{})
		reps["a:80"].thaw.Store(&thaw)
		i = run(5*time.Second, i)
		reps["a:80"].thaw.Store(nil)
		close(thaw)
		run(2*time.Second, i)
		wg.Wait()
		a := reps["a:80"]
		t.Logf("failed GET/POST/keyed %d/%d/%d; the frozen replica drew %d attempts, %d of them plain POSTs; hits a/b/c %d/%d/%d",
			failed[0].Load(), failed[1].Load(), failed[2].Load(), a.frozen.Load(), a.posts.Load(),
			a.hits.Load(), reps["b:80"].hits.Load(), reps["c:80"].hits.Load())
		if n := failed[0].Load() + failed[2].Load(); n != 0 {
			t.Errorf("%d GETs and keyed POSTs failed, want 0", n)
		}
		if n := a.posts.Load(); n > 1 {
			t.Errorf("%d plain POSTs sent to the frozen replica, want at most the one sent before anything was known", n)
		}
		if n := a.frozen.Load(); n > 40 {
			t.Errorf("the frozen replica drew %d attempts in its 5 s, want few", n)
		}
	})
}

// silence marks the lane of addr in rt's key api as silent, as a hedge leg
// lost there with no answer would.
func silence(t *testing.T, rt *Transport, addr string) {
	t.Helper()
	s := rt.scopes.lookup("api").lanes
	now := time.Now()
	var used uint64
	for range policy.MaxLanes {
		l := s.Take(now, used)
		if l.Addr == addr {
			s.Done(l, now, 0, policy.Discarded, lane.Answer{Kind: lane.Silent})
			return
		}
		s.Done(l, now, 0, policy.Canceled, lane.Answer{})
		used |= 1 << l.Index
	}
	t.Fatalf("no lane of %s", addr)
}

// TestARequestThatCannotBeSentTwicePassesOverASilentLane: a PUT or a
// DELETE is idempotent, but one whose body cannot be sent again (no
// GetBody, and no replay buffer, or a body over it) cannot be sent twice
// either, as a plain POST cannot: with the lane of a silent (its last
// attempt lost with no answer), it goes to b or c, while a PUT whose body
// GetBody re-creates still goes to a.
func TestARequestThatCannotBeSentTwicePassesOverASilentLane(t *testing.T) {
	const body = "0123456789abcdef0123456789abcdef" // 32 bytes
	unreplayable := func(method string) *http.Request {
		req, _ := http.NewRequest(method, "http://api/", io.NopCloser(strings.NewReader(body)))
		req.ContentLength = int64(len(body))
		return req
	}
	for _, tc := range []struct {
		name string
		set  policy.Set
		req  func() *http.Request
		toA  bool // the request may be sent twice, and goes to a as to any
	}{
		{"PUT, no replay buffer", policy.Set{Retry: &policy.Retry{}, ReplayBuffer: -1},
			func() *http.Request { return unreplayable(http.MethodPut) }, false},
		{"PUT over the replay buffer", policy.Set{Retry: &policy.Retry{}, Hedge: &policy.Hedge{}, ReplayBuffer: len(body) - 1},
			func() *http.Request { return unreplayable(http.MethodPut) }, false},
		{"DELETE, neither retried nor hedged", policy.Set{},
			func() *http.Request { return unreplayable(http.MethodDelete) }, false},
		{"PUT with GetBody", policy.Set{Retry: &policy.Retry{}, ReplayBuffer: -1},
			func() *http.Request {
				req, _ := http.NewRequest(http.MethodPut, "http://api/", strings.NewReader(body))
				return req
			}, true},
		{"PUT that fits the replay buffer", policy.Set{Retry: &policy.Retry{}},
			func() *http.Request { return unreplayable(http.MethodPut) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFleet()
				for _, a := range []string{"a:80", "b:80", "c:80"} {
					f.serve(a, a[:1])
				}
				tc.set.Replicas = &policy.Replicas{Endpoints: Static("a:80", "b:80", "c:80")}
				rt := newLaneTransport(t, f, Config{Policies: tc.set})
				prime(t, rt, "http://api/")
				before := f.reps["a"].hits.Load() // the prime's
				const calls = 90
				for i := range calls {
					silence(t, rt, "a:80")
					resp, err := rt.RoundTrip(tc.req())
					if err != nil {
						t.Fatalf("call %d: %v", i, err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				n := f.reps["a"].hits.Load() - before
				switch {
				case !tc.toA && n != 0:
					t.Errorf("%d of %d calls went to the silent lane, want 0", n, calls)
				case tc.toA && n == 0:
					t.Errorf("no call of %d went to the silent lane, want about a third", calls)
				}
				t.Logf("%d of %d calls went to a", n, calls)
			})
		})
	}
}

// TestAFrozenReplicaWhoseLegsLoseAt3xIsBackSoonAfterItsThaw: three
// replicas answering in 4 to 6 ms, one answer in ten 8 ms later, so that
// the hedge's threshold (the p95) is about 12 ms; a call every 20 ms,
// GETs through Attempts 3, Retry, Hedge and a PerAttempt timeout of 1 s.
// One replica is frozen for 5 s: its legs lose to their hedges with no
// answer after about 17 ms, 3 times the others' typical latency, below
// the bar of a slow run, and the first such loss is a peak that makes it
// the key's dearest lane, which a pick of two lanes passes over. That
// estimate is only what its silence said, and is stale once a second and
// staleEnds of the key's attempts have passed (4 s at this rate): the
// lane is probed that often, its first answer after the thaw comes
// within 4.5 s, and it has a third of its fair share or more in the 3 s
// after the next 2. Were the peak kept until it decays (10 s's time
// constant, from 3 times the others' latency), the thawed replica would
// get no call for about 11 s.
func TestAFrozenReplicaWhoseLegsLoseAt3xIsBackSoonAfterItsThaw(t *testing.T) {
	const every = 20 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		reps := map[string]*frozenReplica{}
		for _, a := range []string{"a:80", "b:80", "c:80"} {
			reps[a] = &frozenReplica{tail: true}
			f.net.Listen(a, reps[a])
		}
		rt := newLaneTransport(t, f, Config{Policies: policy.Set{
			Attempts: 3,
			Retry:    &policy.Retry{},
			Hedge:    &policy.Hedge{},
			Timeout:  &policy.Timeout{PerAttempt: time.Second},
			Replicas: &policy.Replicas{Endpoints: Static("a:80", "b:80", "c:80")},
		}})
		prime(t, rt, "http://api/")
		var wg sync.WaitGroup
		var failed atomic.Int64
		run := func(d time.Duration) {
			for range int(d / every) {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api/", nil)
					resp, err := rt.RoundTrip(req)
					if err != nil {
						failed.Add(1)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
				time.Sleep(every)
			}
		}
		a := reps["a:80"]
		run(2 * time.Second)
		thaw := make(chan struct{})
		a.thaw.Store(&thaw)
		run(5 * time.Second)
		thawed := time.Now()
		a.watch.Store(true)
		a.thaw.Store(nil)
		close(thaw)
		run(5 * time.Second)
		before := a.hits.Load()
		run(3 * time.Second)
		wg.Wait()
		after := a.hits.Load() - before
		answered := time.Duration(-1) // never
		if at := a.answered.Load(); at != 0 {
			answered = time.Unix(0, at).Sub(thawed)
		}
		t.Logf("the frozen replica drew %d attempts in its 5 s; its first answer %v after its thaw (-1ns: never), %d attempts in the 3 s from 5 s after; hits a/b/c %d/%d/%d; %d calls failed",
			a.frozen.Load(), answered, after, a.hits.Load(), reps["b:80"].hits.Load(), reps["c:80"].hits.Load(), failed.Load())
		switch {
		case answered < 0:
			t.Errorf("the thawed replica answered no call in the 8 s after its thaw, want one within 4.5 s")
		case answered > 4500*time.Millisecond:
			t.Errorf("the thawed replica answered %v after its thaw, want within 4.5 s", answered)
		}
		if calls := int64(3 * time.Second / every); after < calls/9 {
			t.Errorf("the thawed replica drew %d of the %d calls in the 3 s from 5 s after its thaw, want a third of its fair share or more", after, calls)
		}
		if n := failed.Load(); n != 0 {
			t.Errorf("%d calls failed, want 0", n)
		}
	})
}
