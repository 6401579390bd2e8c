package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
)

// loserLeg is what a base saw of one wire call: its context, the body it
// answered with, and whether that context had ended when the answer was
// ready.
type loserLeg struct {
	ctx       context.Context
	body      *eofBody
	cancelled bool
}

// eofBody is a response body that records being read to its end and
// being closed.
type eofBody struct {
	r      io.Reader
	eof    atomic.Bool
	closed atomic.Bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *eofBody) Close() error { b.closed.Store(true); return nil }

// loserBase answers each wire call after the latency of its index (calls
// from 0), unless its context ends first, recording each call.
type loserBase struct {
	latency func(i int) time.Duration
	mu      sync.Mutex
	legs    []*loserLeg
}

func (b *loserBase) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := &loserLeg{ctx: r.Context()}
	b.mu.Lock()
	i := len(b.legs)
	b.legs = append(b.legs, rec)
	b.mu.Unlock()
	t := time.NewTimer(b.latency(i))
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		b.mu.Lock()
		rec.cancelled = true
		b.mu.Unlock()
		return nil, context.Cause(r.Context())
	}
	resp := respond(r, 200)
	rec.body = &eofBody{r: strings.NewReader("answer")}
	resp.Body = rec.body
	return resp, nil
}

func (b *loserBase) leg(i int) *loserLeg {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.legs[i]
}

// TestHedgeLoserBringsItsHeadersWithinItsGrace: the inline leg answers
// just after its hedge was sent and wins; the hedge, which would answer
// 5ms later, is not cut off mid-flight: it gets DrainTime to bring its
// headers, and its body is then read to its end
// and closed, so that over HTTP/1.1 its connection is kept. The caller
// does not wait for it.
func TestHedgeLoserBringsItsHeadersWithinItsGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var th time.Duration
		base := &loserBase{latency: func(i int) time.Duration {
			switch {
			case i < 20:
				return 10 * time.Millisecond
			case i == 20: // the inline leg of the call measured
				return th + time.Millisecond
			}
			return 5 * time.Millisecond // its hedge
		}}
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{}}})
		warm(t, tr, 20)
		th = tr.Measured("up.test").HedgeThreshold
		start := time.Now()
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != th+time.Millisecond {
			t.Fatalf("the call took %v, want the inline leg's %v", d, th+time.Millisecond)
		}
		time.Sleep(httpx.DrainTime) // whatever the loser does, it is done by now
		synctest.Wait()
		synctest.Wait()
		hedge := base.leg(21)
		if hedge.cancelled {
			t.Fatal("the losing hedge was cancelled before its headers, 4ms after it lost")
		}
		if !hedge.body.eof.Load() || !hedge.body.closed.Load() {
			t.Fatalf("the losing hedge's body: read to its end %v, closed %v; want both", hedge.body.eof.Load(), hedge.body.closed.Load())
		}
		if !errors.Is(context.Cause(hedge.ctx), context.Canceled) {
			t.Fatalf("the losing hedge's context: %v, want it released once its body was done", context.Cause(hedge.ctx))
		}
	})
}

// TestHedgeLoserIsCancelledAfterItsGrace: a losing hedge that would
// answer long after the round was won is cancelled, as discarded, when
// its grace runs out: DrainTime after the round was won.
func TestHedgeLoserIsCancelledAfterItsGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var th time.Duration
		base := &loserBase{latency: func(i int) time.Duration {
			switch {
			case i < 20:
				return 10 * time.Millisecond
			case i == 20:
				return th + time.Millisecond
			}
			return time.Hour
		}}
		tr := mustNew(t, Config{Base: base, Policies: policy.Set{Hedge: &policy.Hedge{}}})
		warm(t, tr, 20)
		th = tr.Measured("up.test").HedgeThreshold
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		won := time.Now()
		synctest.Wait()
		hedge := base.leg(21)
		if hedge.ctx.Err() != nil {
			t.Fatal("the losing hedge was cancelled before its grace ran out")
		}
		time.Sleep(httpx.DrainTime)
		synctest.Wait()
		if !errors.Is(context.Cause(hedge.ctx), errDiscarded) {
			t.Fatalf("the losing hedge's context: %v, want it cancelled as discarded", context.Cause(hedge.ctx))
		}
		if d := time.Since(won); d != httpx.DrainTime {
			t.Fatalf("cancelled %v after the round was won", d)
		}
	})
}

// TestLoopbackHedgeLosersKeepTheirConnections: over HTTP/1.1 a request
// cancelled in flight takes its connection with it. Against a loopback
// server whose measured calls are hedged, and whose hedge answers 2ms
// after the call has returned the first leg's answer, the losing hedges
// bring their headers within their grace and keep their connection: two
// connections in all, not one more for each hedge. The hedge waits for
// the call's return, not for a moment on the server's clock, so that a
// busy machine cannot let it win.
func TestLoopbackHedgeLosersKeepTheirConnections(t *testing.T) {
	const calls = 10
	var (
		inflight atomic.Int32
		measured atomic.Bool
		returned [calls]chan struct{} // closed when call i has returned
	)
	for i := range returned {
		returned[i] = make(chan struct{})
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !measured.Load() {
			time.Sleep(20 * time.Millisecond) // what the window learns
			return
		}
		i, err := strconv.Atoi(r.Header.Get("Call"))
		if err != nil || i < 0 || i >= calls {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if inflight.Add(1) == 1 {
			// The first leg: slow enough to be hedged.
			time.Sleep(60 * time.Millisecond)
			inflight.Add(-1)
			return
		}
		// The hedge: it answers just after the call has returned.
		<-returned[i]
		time.Sleep(2 * time.Millisecond)
		inflight.Add(-1)
	}))
	defer srv.Close()
	defer func() { // a call that failed leaves no hedge waiting
		for _, ch := range returned {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}()
	var dials atomic.Int64
	base := dialCounting(4, &dials)
	defer base.CloseIdleConnections()
	var started, won atomic.Int64
	obs := &policy.Observer{
		HedgeStarted: func(policy.HedgeInfo) { started.Add(1) },
		HedgeWon:     func(policy.HedgeInfo) { won.Add(1) },
	}
	set := policy.Set{Hedge: &policy.Hedge{MinSamples: 5, MaxConcurrent: 2}, Budget: policy.Budget{Ratio: -1}}
	c := &http.Client{Transport: mustNew(t, Config{Base: base, Policies: set, Observer: obs})}
	get := func(i int) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("Call", strconv.Itoa(i))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for range 5 {
		get(0)
	}
	measured.Store(true)
	for i := range calls {
		get(i)
		close(returned[i])
		for inflight.Load() > 0 { // the loser's answer, on its way
			time.Sleep(time.Millisecond)
		}
	}
	// On a busy machine the threshold the warm-up taught may be above a
	// first leg's time now and then: half the calls hedged by a loser
	// are enough to tell connections kept from one dialled a loser.
	if s, w := started.Load(), won.Load(); s < calls/2 || w != 0 {
		t.Fatalf("%d hedges started, %d won; want at least %d, none", s, w, calls/2)
	}
	if n := dials.Load(); n > 3 {
		t.Errorf("%d connections dialled for %d calls, each hedged by a loser that answered 2ms late", n, 5+calls)
	}
}

// TestHedgeRefusedByTheBudgetIsTriedAgain: the budget's hedge allowance
// holds one token (Max 2). Two slow calls come due at once; the first takes
// the token, the second is refused. A refused hedge is not given up: the
// round asks again one threshold later, and the second call is hedged once
// the budget has earned a token.
func TestHedgeRefusedByTheBudgetIsTriedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if i := n.Add(1); i == 6 || i == 7 { // the two slow calls' first legs
				d = time.Hour
			}
			return respondAfter(r, d)
		})
		var ev hedgeEvents
		set := policy.Set{
			Hedge:  &policy.Hedge{MinSamples: 5},
			Budget: policy.Budget{Max: 2, Ratio: 1e-9, MinPerSecond: 100},
		}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
		warm(t, tr, 5)
		th := tr.Measured("up.test").HedgeThreshold
		time.Sleep(time.Second) // the budget is full: one hedge
		var wg sync.WaitGroup
		took := make([]time.Duration, 2)
		for i := range took {
			wg.Go(func() {
				start := time.Now()
				if _, err := do(t, t.Context(), tr); err != nil {
					t.Error(err)
				}
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		if r := ev.reason(policy.HedgeBudget); r != 1 {
			t.Errorf("the budget refused %d hedges, want 1: the second call's first try", r)
		}
		// The first call's hedge, at th, answers 10ms later; the second's
		// is refused at th and sent at 2th, when the budget holds a token
		// again.
		slices.Sort(took)
		if want := []time.Duration{th + 10*time.Millisecond, 2*th + 10*time.Millisecond}; !slices.Equal(took, want) {
			t.Errorf("the calls took %v, want %v", took, want)
		}
	})
}

// TestHedgeRefusedByAnEmptyBudgetBacksOff: a budget that never refills,
// emptied by a hedge that lost (one that won would earn its token back).
// A slow call's round asks again one threshold after each refusal, three
// times, then backing off: refused at 1, 2, 3, 4, 6, 10 and 18 thresholds
// into a call whose first leg answers at 20.
func TestHedgeRefusedByAnEmptyBudgetBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		var th time.Duration
		base := fakeRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			switch n.Add(1) {
			case 6: // a slow call, whose hedge takes the allowance's one token and loses
				d = th + time.Millisecond
			case 8: // the slow call measured
				d = 20 * th
			}
			return respondAfter(r, d)
		})
		var ev hedgeEvents
		set := policy.Set{
			Hedge:  &policy.Hedge{MinSamples: 5},
			Budget: policy.Budget{Max: 2, Ratio: 1e-9, MinPerSecond: -1}, // one hedge
		}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: ev.observer()})
		warm(t, tr, 5)
		th = tr.Measured("up.test").HedgeThreshold
		warm(t, tr, 1) // hedged, and the hedge lost: the budget is empty from now on
		if s, won := ev.counts(); s != 1 || won != 0 {
			t.Fatalf("%d hedges, %d won; want the one that empties the budget, lost", s, won)
		}
		if got := tr.Measured("up.test").HedgeThreshold; got != th {
			t.Fatalf("threshold %v after the slow call, want %v still", got, th)
		}
		start := time.Now()
		if _, err := do(t, t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 20*th {
			t.Errorf("the call took %v, want its first leg's %v", d, 20*th)
		}
		if r := ev.reason(policy.HedgeBudget); r != 7 {
			t.Errorf("the budget refused %d times, want 7 (at 1, 2, 3, 4, 6, 10 and 18 thresholds)", r)
		}
	})
}
