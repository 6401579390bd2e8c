package gate

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// newShared returns a rate limiter on store, its defaults applied.
func newShared(r policy.RateLimit, store policy.SharedLimiter, report func(policy.StoreTransition)) *RateLimiter {
	r.Shared = store
	return NewRateLimiter(r.WithDefaults(), "k", 1, report)
}

// neverAsked is a store for the pure-core tests, which answer asks
// themselves through answer.
type neverAsked struct{ t *testing.T }

func (s neverAsked) Take(context.Context, string, int) (int, time.Duration, error) {
	s.t.Error("the store was asked")
	return 0, 0, nil
}

// TestLeaseSteps walks the lease through explicit instants: ask sizes,
// the ask at half a lease, a partial grant and its retry-after, tokens
// joining the next lease, expiry, and no early ask for one-token leases.
// Calls here may not wait (a zero waitUntil); asks are answered by hand.
func TestLeaseSteps(t *testing.T) {
	ms := time.Millisecond
	l := newShared(policy.RateLimit{PerSecond: 100, Lease: 4}, neverAsked{t}, nil)
	type step struct {
		at time.Duration
		// answer: the store's answer to the ask in flight; else a call.
		answer  bool
		granted int
		retry   time.Duration

		verdict leaseVerdict  // a call's
		hint    time.Duration // a refusal's
		ask     int           // the tokens the call asks for, 0 for none
		tokens  int           // leased and unspent after the step
	}
	steps := []step{
		{at: 0, verdict: leaseRefuse, ask: 4}, // the first ask is for a whole Lease
		{at: 0, verdict: leaseRefuse},         // one ask at a time
		{at: 10 * ms, answer: true, granted: 4, tokens: 4},
		{at: 10 * ms, verdict: leaseAdmit, tokens: 3},
		{at: 10 * ms, verdict: leaseAdmit, ask: 4, tokens: 2}, // half spent: the next is asked for
		{at: 11 * ms, verdict: leaseAdmit, tokens: 1},
		{at: 20 * ms, answer: true, granted: 1, retry: 30 * ms, tokens: 2}, // the store had one: the last token joins it
		{at: 20 * ms, verdict: leaseAdmit, tokens: 1},                      // not before the store's retry-after
		{at: 20 * ms, verdict: leaseAdmit, tokens: 0},
		{at: 40 * ms, verdict: leaseRefuse, hint: 10 * ms},
		{at: 50 * ms, verdict: leaseRefuse, ask: 4}, // 5 calls in 40ms: more than a Lease in half a second
		{at: 60 * ms, answer: true, granted: 4, tokens: 4},
		{at: 1049 * ms, verdict: leaseAdmit, tokens: 3},
		{at: 1050 * ms, verdict: leaseRefuse, ask: 1}, // expired 1s after the ask; 2 calls in 1s: one token
		{at: 1060 * ms, answer: true, granted: 1, tokens: 1},
		{at: 1060 * ms, verdict: leaseAdmit, tokens: 0}, // a one-token lease: nothing asked ahead
		{at: 1500 * ms, verdict: leaseRefuse, ask: 3},   // 2 calls in 450ms: ceil(2 × 0.5s / 0.45s)
	}
	for i, st := range steps {
		now := rlStart.Add(st.at)
		if st.answer {
			if from, to := l.answer(now, st.granted, st.retry, nil); from != policy.StoreUp || to != policy.StoreUp {
				t.Fatalf("step %d: answer moved the store from %v to %v", i, from, to)
			}
		} else {
			d := l.decide(now, time.Time{}, true)
			if d.verdict != st.verdict || d.retryAfter != st.hint || d.ask != st.ask {
				t.Fatalf("step %d at %v: verdict %d, hint %v, ask %d; want %d, %v, %d",
					i, st.at, d.verdict, d.retryAfter, d.ask, st.verdict, st.hint, st.ask)
			}
		}
		if state, leased := l.Store(now); state != policy.StoreUp || leased != st.tokens {
			t.Fatalf("step %d at %v: Store = %v, %d; want up, %d", i, st.at, state, leased, st.tokens)
		}
	}
}

// TestLeaseFailure: a failed ask moves the store to the failing state
// FailOpen picks, leased tokens are still spent, calls then fall back or
// are refused with the time until the next ask, asks back off (each wait
// in the upper half of 50ms doubling to 500ms), and the first answer
// brings the store back. An ask past StoreTimeout counts as failed for
// calls before the store says so.
func TestLeaseFailure(t *testing.T) {
	ms := time.Millisecond
	errDown := errors.New("down")
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			failing, verdict := policy.StoreRefusing, leaseRefuse
			if failOpen {
				failing, verdict = policy.StoreFallback, leaseFallback
			}
			l := newShared(policy.RateLimit{PerSecond: 100, Lease: 4, FailOpen: failOpen}, neverAsked{t}, nil)
			now := rlStart
			if d := l.decide(now, time.Time{}, true); d.ask != 4 {
				t.Fatalf("first call asked for %d", d.ask)
			}
			l.answer(now, 4, 0, nil)
			l.decide(now, time.Time{}, true)
			if d := l.decide(now, time.Time{}, true); d.verdict != leaseAdmit || d.ask == 0 {
				t.Fatalf("second call: %+v, want admitted with an ask", d)
			}
			// The ask is overdue at 50ms: calls no longer count on it, but
			// leased tokens are spent first, and the store is not declared
			// failing until it answers.
			now = now.Add(50 * ms)
			for range 2 {
				if d := l.decide(now, now.Add(time.Second), true); d.verdict != leaseAdmit {
					t.Fatalf("with leased tokens left: %+v", d)
				}
			}
			if d := l.decide(now, now.Add(time.Second), true); d.verdict != verdict || d.ask != 0 {
				t.Fatalf("overdue ask: %+v, want verdict %d and no ask", d, verdict)
			}
			if state, _ := l.Store(now); state != policy.StoreUp {
				t.Fatalf("overdue ask: Store = %v, want up until it answers", state)
			}
			if from, to := l.answer(now, 0, 0, context.DeadlineExceeded); from != policy.StoreUp || to != failing {
				t.Fatalf("failed ask moved the store from %v to %v", from, to)
			}
			for k := 1; k <= 8; k++ {
				d := l.decide(now, now.Add(time.Second), true)
				if d.verdict != verdict || d.ask != 0 {
					t.Fatalf("failure %d: %+v, want verdict %d and no ask", k, d, verdict)
				}
				upper := min(50*ms<<(k-1), 500*ms)
				wait := l.shared.next.Sub(now)
				if wait < upper/2 || wait > upper {
					t.Fatalf("failure %d: next ask in %v, want in [%v, %v]", k, wait, upper/2, upper)
				}
				if !failOpen && d.retryAfter != wait {
					t.Fatalf("failure %d: refused with hint %v, want %v", k, d.retryAfter, wait)
				}
				if d := l.decide(now.Add(wait-1), time.Time{}, true); d.ask != 0 {
					t.Fatalf("failure %d: asked before the backoff", k)
				}
				now = now.Add(wait)
				d = l.decide(now, now.Add(time.Second), true)
				if d.verdict != verdict || d.ask == 0 {
					t.Fatalf("failure %d: %+v after the backoff, want verdict %d and an ask (no wait while failing)", k, d, verdict)
				}
				now = now.Add(ms)
				if from, to := l.answer(now, 0, 0, errDown); from != failing || to != failing {
					t.Fatalf("failure %d: moved the store from %v to %v", k+1, from, to)
				}
			}
			now = now.Add(l.shared.next.Sub(now))
			if d := l.decide(now, time.Time{}, true); d.ask == 0 {
				t.Fatal("no ask after the last backoff")
			}
			if from, to := l.answer(now, 3, 0, nil); from != failing || to != policy.StoreUp {
				t.Fatalf("an answer moved the store from %v to %v, want up", from, to)
			}
			if d := l.decide(now, time.Time{}, true); d.verdict != leaseAdmit {
				t.Fatalf("after recovery: %+v", d)
			}
		})
	}
}

// TestLeaseBadAnswers: a grant beyond the ask counts as the ask, a
// negative one as none, a store that grants nothing with no retry-after
// is not asked again for a millisecond, and one that grants part with no
// retry-after may be asked again at once.
func TestLeaseBadAnswers(t *testing.T) {
	l := newShared(policy.RateLimit{PerSecond: 100, Lease: 4}, neverAsked{t}, nil)
	now := rlStart
	l.decide(now, time.Time{}, true)
	l.answer(now, 1000, 0, nil)
	if _, leased := l.Store(now); leased != 4 {
		t.Fatalf("granted 1000 of 4: %d leased, want 4", leased)
	}
	l = newShared(policy.RateLimit{PerSecond: 100, Lease: 4}, neverAsked{t}, nil)
	l.decide(now, time.Time{}, true)
	l.answer(now, -3, -time.Second, nil)
	if _, leased := l.Store(now); leased != 0 {
		t.Fatalf("granted -3: %d leased, want 0", leased)
	}
	if d := l.decide(now, time.Time{}, true); d.ask != 0 || d.retryAfter != time.Millisecond {
		t.Fatalf("after a grant of none with no retry-after: %+v, want no ask and a 1ms hint", d)
	}
	// Part of an ask with no retry-after (a store that cuts asks to its
	// burst): the scope may ask again at once.
	l = newShared(policy.RateLimit{PerSecond: 100, Lease: 4}, neverAsked{t}, nil)
	l.decide(now, time.Time{}, true)
	l.answer(now, 1, 0, nil)
	if d := l.decide(now, time.Time{}, true); d.verdict != leaseAdmit || d.ask != 4 {
		t.Fatalf("after a grant of 1 of 4 with no retry-after: %+v, want admitted and the next ask", d)
	}
}

// fakeStore is a SharedLimiter in memory, for bubbles: it answers after
// latency (cut short by ctx, unless deaf), fails while down, and otherwise
// grants from a token bucket of rate per second and burst, full at the
// start; a zero rate grants everything.
type fakeStore struct {
	latency time.Duration
	deaf    bool // ignores ctx

	mu     sync.Mutex
	down   bool
	rate   float64
	burst  float64
	bucket float64
	last   time.Time
	asks   int // answered
	tokens int // granted
}

var errStoreDown = errors.New("store down")

func (f *fakeStore) Take(ctx context.Context, key string, n int) (int, time.Duration, error) {
	if key != "k" {
		return 0, 0, fmt.Errorf("asked for key %q", key)
	}
	if f.latency > 0 {
		t := time.NewTimer(f.latency)
		defer t.Stop()
		if f.deaf {
			<-t.C
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
				return 0, 0, ctx.Err()
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asks++
	if f.down {
		return 0, 0, errStoreDown
	}
	if f.rate == 0 {
		f.tokens += n
		return n, 0, nil
	}
	now := time.Now()
	if f.last.IsZero() {
		f.bucket = f.burst
	} else {
		f.bucket = min(f.burst, f.bucket+f.rate*now.Sub(f.last).Seconds())
	}
	f.last = now
	g := min(n, int(f.bucket))
	f.bucket -= float64(g)
	f.tokens += g
	var retry time.Duration
	if g < n {
		retry = time.Duration((float64(n-g) - f.bucket) / f.rate * float64(time.Second))
	}
	return g, retry, nil
}

func (f *fakeStore) setDown(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *fakeStore) counts() (asks, tokens int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asks, f.tokens
}

// transitions records the store transitions a limiter reports.
type transitions struct {
	mu  sync.Mutex
	got []policy.StoreTransition
	at  []time.Time
}

func (tr *transitions) report(e policy.StoreTransition) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, e)
	tr.at = append(tr.at, time.Now())
}

// moves returns the transitions as "from→to" strings.
func (tr *transitions) moves() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var s []string
	for _, e := range tr.got {
		s = append(s, e.From.String()+"→"+e.To.String())
	}
	return s
}

// TestLeaseWait: a call waits for the lease on its way, never longer than
// StoreTimeout (50ms) nor past its deadline, and not at all when its
// context is done (a hedge leg); an ask that times out reaches the
// observer once, with a Context that is never nil.
func TestLeaseWait(t *testing.T) {
	ms := time.Millisecond
	type ctxKey struct{}
	tests := []struct {
		name      string
		latency   time.Duration
		deaf      bool
		failOpen  bool
		deadline  time.Duration // 0: none
		cancelAt  time.Duration // 0: never; negative: before the call
		want      bool
		wantAfter time.Duration
		wantMoves []string
	}{
		{name: "lease in time", latency: 10 * ms, want: true, wantAfter: 10 * ms},
		{name: "store too slow", latency: 80 * ms, want: false, wantAfter: 50 * ms, wantMoves: []string{"up→refusing"}},
		{name: "store too slow, FailOpen", latency: 80 * ms, failOpen: true, want: true, wantAfter: 50 * ms, wantMoves: []string{"up→fallback"}},
		{name: "store deaf to ctx", latency: 200 * ms, deaf: true, want: false, wantAfter: 50 * ms},
		{name: "deadline sooner", latency: 30 * ms, deadline: 20 * ms, want: false, wantAfter: 20 * ms},
		{name: "caller gives up", latency: 30 * ms, cancelAt: 5 * ms, want: false, wantAfter: 5 * ms},
		{name: "no wait for a done context", latency: 10 * ms, cancelAt: -1, want: false, wantAfter: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &fakeStore{latency: tt.latency, deaf: tt.deaf}
				var tr transitions
				l := newShared(policy.RateLimit{PerSecond: 100, Burst: 1, FailOpen: tt.failOpen}, store, tr.report)
				ctx, cancel := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "trace"))
				defer cancel()
				if tt.deadline > 0 {
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				switch {
				case tt.cancelAt < 0:
					cancel()
				case tt.cancelAt > 0:
					time.AfterFunc(tt.cancelAt, cancel)
				}
				start := time.Now()
				ok, _ := l.Acquire(ctx, start)
				if after := time.Since(start); ok != tt.want || after != tt.wantAfter {
					t.Fatalf("Acquire = %v after %v, want %v after %v", ok, after, tt.want, tt.wantAfter)
				}
				// A second call meanwhile: a deaf store's ask is overdue, so
				// it does not wait either.
				if tt.deaf {
					time.Sleep(50 * ms)
					start = time.Now()
					if ok, _ := l.Acquire(t.Context(), start); ok || time.Since(start) != 0 {
						t.Fatalf("call during an overdue ask: %v after %v, want refused at once", ok, time.Since(start))
					}
				}
				time.Sleep(time.Second) // every ask has answered
				if got := tr.moves(); !cmp.Equal(got, tt.wantMoves) {
					t.Errorf("transitions %q, want %q", got, tt.wantMoves)
				}
				for _, e := range tr.got {
					if e.Context == nil || e.Context.Value(ctxKey{}) != "trace" || e.Context.Err() != nil || e.Key != "k" ||
						!errors.Is(e.Err, context.DeadlineExceeded) {
						t.Errorf("transition %+v: want the call's values, not its cancellation, key k, a deadline error", e)
					}
				}
			})
		})
	}
}

// TestLeaseWaitEndsWithTheAsk: a call that finds an ask in flight waits
// until the ask is StoreTimeout old, not StoreTimeout from its own start:
// by then the ask has failed, as far as calls go, even if the store is
// deaf to its context and has not said so.
func TestLeaseWaitEndsWithTheAsk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &fakeStore{latency: 200 * time.Millisecond, deaf: true}
		l := newShared(policy.RateLimit{PerSecond: 100, Burst: 1, FailOpen: true}, store, nil)
		done, cancel := context.WithCancel(t.Context())
		cancel()
		if ok, _ := l.Acquire(done, time.Now()); ok { // a hedge leg: starts the ask, does not wait
			t.Fatal("admitted without a lease")
		}
		time.Sleep(30 * time.Millisecond)
		start := time.Now()
		if ok, _ := l.Acquire(t.Context(), start); !ok || time.Since(start) != 20*time.Millisecond {
			t.Fatalf("Acquire = %v after %v, want the fallback's token after 20ms, when the ask is 50ms old", ok, time.Since(start))
		}
		time.Sleep(time.Second)
	})
}

// TestLeaseRecovers: the store is down from 0.5s to 1.5s under calls
// every millisecond. The observer hears one transition each way, the
// store is asked a handful of times while down (backoff), never more than
// once at a time, and the shared limit is back within the backoff's cap
// of the store's return. With FailOpen the calls meanwhile go on at the
// local rate; without it they are refused, once the lease in hand is
// spent.
func TestLeaseRecovers(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const storeRate, localRate = 200, 50
				store := &fakeStore{latency: time.Millisecond, rate: storeRate, burst: 20}
				var tr transitions
				l := newShared(policy.RateLimit{PerSecond: localRate, Burst: 5, Lease: 10, FailOpen: failOpen}, store, tr.report)
				start := time.Now()
				var admitted [5]int // per half second
				var asksBefore, asksWhileDown int
				for i := range 2500 {
					now := start.Add(time.Duration(i) * time.Millisecond)
					time.Sleep(time.Until(now))
					switch i {
					case 500:
						asksBefore, _ = store.counts()
						store.setDown(true)
					case 1500:
						asks, _ := store.counts()
						asksWhileDown = asks - asksBefore
						store.setDown(false)
					}
					if ok, _ := l.Acquire(t.Context(), now); ok {
						admitted[i/500]++
					}
				}
				time.Sleep(time.Second)
				want := []string{"up→refusing", "refusing→up"}
				if failOpen {
					want = []string{"up→fallback", "fallback→up"}
				}
				if got := tr.moves(); !cmp.Equal(got, want) {
					t.Fatalf("transitions %q, want %q", got, want)
				}
				if asksWhileDown > 8 {
					t.Errorf("the store was asked %d times in the second it was down, want at most 8 (backoff)", asksWhileDown)
				}
				if back := tr.at[1].Sub(start.Add(1500 * time.Millisecond)); back > storeBackoffMax+2*time.Millisecond {
					t.Errorf("back %v after the store, want within %v", back, storeBackoffMax)
				}
				// Half a second at the store's rate: 100, plus its burst and
				// a lease in the first half; the last half is the limit back.
				lo, hi := storeRate/2-5, storeRate/2+20+10
				for _, i := range []int{0, 4} {
					if admitted[i] < lo || admitted[i] > hi {
						t.Errorf("half %d, store up: %d admitted, want in [%d, %d]", i, admitted[i], lo, hi)
					}
				}
				down := admitted[1] + admitted[2]
				if failOpen {
					// A second at the local rate, its burst, and what was
					// leased when the store went down.
					if down < localRate-5 || down > localRate+5+15 {
						t.Errorf("store down, FailOpen: %d admitted in a second, want %d (+ burst and lease)", down, localRate)
					}
				} else if down > 15 {
					t.Errorf("store down, failing closed: %d admitted, want at most the lease in hand (at most 15)", down)
				}
			})
		})
	}
}

// TestLeaseRoundTrips: a busy scope asks the store once per Lease calls,
// and after the first call no call waits: the next lease is asked for
// when half of one is spent.
func TestLeaseRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease, calls = 50, 10000
		store := &fakeStore{latency: time.Millisecond}
		l := newShared(policy.RateLimit{PerSecond: 1000, Lease: lease}, store, nil)
		waited := 0
		for range calls {
			start := time.Now()
			if ok, _ := l.Acquire(t.Context(), start); !ok {
				t.Fatal("refused")
			}
			if time.Since(start) > 0 {
				waited++
			}
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(time.Second)
		asks, tokens := store.counts()
		if asks > calls/lease+1 {
			t.Errorf("%d asks for %d calls, want at most calls/Lease + 1 = %d", asks, calls, calls/lease+1)
		}
		if waited != 1 {
			t.Errorf("%d calls waited for the store, want 1 (the first)", waited)
		}
		if tokens > calls+lease+lease/2 {
			t.Errorf("%d tokens leased for %d calls", tokens, calls)
		}
	})
}

// TestLeaseIdleDoesNotHoard: a scope called once every two seconds takes
// one token per call after its first lease, and holds none between calls:
// a lease expires a LeaseTTL after it was asked for.
func TestLeaseIdleDoesNotHoard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lease = 50
		store := &fakeStore{latency: time.Millisecond}
		l := newShared(policy.RateLimit{PerSecond: 200, Lease: lease}, store, nil)
		for i := range 10 {
			if ok, _ := l.Acquire(t.Context(), time.Now()); !ok {
				t.Fatalf("call %d refused", i)
			}
			time.Sleep(time.Second)
			if _, leased := l.Store(time.Now()); leased != 0 {
				t.Fatalf("call %d: %d tokens held a second later", i, leased)
			}
			time.Sleep(time.Second)
		}
		if _, tokens := store.counts(); tokens != lease+9 {
			t.Errorf("%d tokens leased for 10 calls, want %d: the first Lease, then one per call", tokens, lease+9)
		}
	})
}

// TestLeaseConcurrent: goroutines share a scope on a store of 200 per
// second: no more is admitted than the store granted, and about what it
// grants in the time.
func TestLeaseConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &fakeStore{latency: time.Millisecond, rate: 200, burst: 20}
		l := newShared(policy.RateLimit{PerSecond: 100, Lease: 17}, store, nil)
		var mu sync.Mutex
		admitted := 0
		var wg sync.WaitGroup
		start := time.Now()
		for range 8 {
			wg.Go(func() {
				for time.Since(start) < 2*time.Second {
					if ok, _ := l.Acquire(t.Context(), time.Now()); ok {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second)
		_, granted := store.counts()
		_, leased := l.Store(time.Now())
		if admitted+leased > granted {
			t.Errorf("%d admitted and %d held, more than the %d granted", admitted, leased, granted)
		}
		if lo, hi := 2*200-10, 2*200+20+17; admitted < lo || admitted > hi {
			t.Errorf("%d admitted in 2s at 200/s, want in [%d, %d]", admitted, lo, hi)
		}
	})
}

type panicStore struct{}

func (panicStore) Take(context.Context, string, int) (int, time.Duration, error) { panic("boom") }

// TestLeasePanickingStore: a store's panic is its error, reported to the
// observer; nothing else of the process is taken down with it.
func TestLeasePanickingStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var tr transitions
		l := newShared(policy.RateLimit{PerSecond: 100}, panicStore{}, tr.report)
		if ok, _ := l.Acquire(t.Context(), time.Now()); ok {
			t.Fatal("admitted with a panicking store")
		}
		synctest.Wait()
		if len(tr.got) != 1 || tr.got[0].To != policy.StoreRefusing || !strings.Contains(fmt.Sprint(tr.got[0].Err), "panicked: boom") {
			t.Fatalf("transitions %+v, want one to refusing with the panic", tr.got)
		}
	})
}

// TestLeaseAllocs: spending a leased token allocates nothing.
func TestLeaseAllocs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &fakeStore{}
		l := newShared(policy.RateLimit{PerSecond: 1e6, Lease: 1 << 20}, store, nil)
		l.Acquire(t.Context(), time.Now())
		synctest.Wait()
		ctx := t.Context()
		now := time.Now()
		if allocs := testing.AllocsPerRun(1000, func() {
			if ok, _ := l.Acquire(ctx, now); !ok {
				t.Fatal("refused")
			}
		}); allocs != 0 {
			t.Fatalf("spending a leased token: %v allocs, want 0", allocs)
		}
	})
}

// BenchmarkRateLimiterShared is the per-call cost of a shared rate limit
// with a warm lease: the store (in memory, answering at once) is asked in
// the background once per Lease calls. allocs/call counts the asks'
// allocations too, amortized, exactly (allocs/op rounds down); asks/call
// is the store's round trips per call, and refused/call the calls that
// found the lease empty because the next one was late.
func BenchmarkRateLimiterShared(b *testing.B) {
	for _, lease := range []int{64, 1024} {
		b.Run(fmt.Sprintf("lease=%d", lease), func(b *testing.B) {
			store := &fakeStore{}
			l := NewRateLimiter(policy.RateLimit{PerSecond: 1e9, Burst: 1, Shared: store, Lease: lease,
				LeaseTTL: time.Hour, StoreTimeout: time.Second}, "k", 1, nil)
			ctx := context.Background()
			l.Acquire(ctx, time.Now()) // the first lease
			refused := 0
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			asks0, _ := store.counts()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if ok, _ := l.Acquire(ctx, time.Now()); !ok {
					refused++
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			asks, _ := store.counts()
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/call")
			b.ReportMetric(float64(asks-asks0)/float64(b.N), "asks/call")
			b.ReportMetric(float64(refused)/float64(b.N), "refused/call")
		})
	}
}
