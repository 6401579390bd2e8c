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

	"github.com/resilix/resilix/policy"
)

// frozenReplica answers after 4 to 6 ms, except while frozen: then it
// holds what arrives until it thaws (as a SIGSTOPped server's kernel
// accepts and queues) or its request is cancelled.
type frozenReplica struct {
	hits   atomic.Int64
	frozen atomic.Int64 // hits while frozen
	posts  atomic.Int64 // plain POSTs that arrived while frozen
	thaw   atomic.Pointer[chan struct{}]
}

func (r *frozenReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	n := r.hits.Add(1)
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
	select {
	case <-time.After(4*time.Millisecond + time.Duration(n%5)*500*time.Microsecond):
	case <-req.Context().Done():
		return
	}
	io.WriteString(w, "ok")
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
