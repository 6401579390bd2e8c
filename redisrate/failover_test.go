//go:build unix

package redisrate

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/transport"
)

// call is one RoundTrip as the failover driver saw it.
type call struct {
	at          time.Time
	took        time.Duration
	admitted    bool
	rateLimited bool
}

// drive calls get every millisecond until stop is closed, and returns the
// calls it made; a call neither admitted nor rate limited fails t.
func drive(t *testing.T, stop <-chan struct{}, get func() (ok, limited bool, err error)) []call {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var calls []call
	for {
		start := time.Now()
		ok, limited, err := get()
		if !ok && !limited {
			t.Errorf("a call failed otherwise than rate limited: %v", err)
		}
		calls = append(calls, call{start, time.Since(start), ok, limited})
		select {
		case <-stop:
			return calls
		case <-tick.C:
		}
	}
}

// admittedRate returns the admitted calls a second among those started in
// [from, to), and how many they are.
func admittedRate(calls []call, from, to time.Time) (float64, int) {
	n := 0
	for _, c := range calls {
		if c.admitted && !c.at.Before(from) && c.at.Before(to) {
			n++
		}
	}
	return float64(n) / to.Sub(from).Seconds(), n
}

// move is one store transition as the Observer heard it.
type move struct {
	at       time.Time
	from, to policy.StoreState
	err      error
}

// TestFailover calls through a transport with a shared limit of 100 a
// second on a real Redis, offering 1000 calls a second, while Redis is
// killed (SIGKILL) after 1s and restarted a second later, or hangs
// (SIGSTOP) for that second. The first ask after the failure fails; the
// Observer hears the store fail and come back (and, on a busy machine,
// an ask that timed out while Redis was up: a pair of its own); with
// FailOpen calls go on under the local limit, and without it none is
// admitted until Redis is back; then calls are admitted again; no call
// waits for the whole outage; the shared limit is never exceeded (with
// FailOpen, the local bucket admits calls beside it during the busy
// machine's pairs of transitions, as it should). With
// timing() (make redis): the first ask fails within StoreTimeout, no call
// waits longer, the one transition each way, the rates within 20% of the
// limits (the local one, 300 a second, while Redis is down), and the
// shared limit back within a second of Redis.
func TestFailover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failOpen bool
		hang     bool
	}{
		{"killed, FailOpen", true, false},
		{"killed, failing closed", false, false},
		{"hung, FailOpen", true, true},
		{"hung, failing closed", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testFailover(t, tc.failOpen, tc.hang)
		})
	}
}

func testFailover(t *testing.T, failOpen, hang bool) {
	const shared, local, timeout = 100, 300, policy.DefaultStoreTimeout
	s := startRedis(t)
	store := &countingStore{SharedLimiter: mustNew(t, newClient(t, s.addr), Limit{Rate: shared, Burst: 10})}
	var mu sync.Mutex
	var moves []move
	tr, err := transport.New(transport.Config{
		Base: okBase{},
		Policies: policy.Set{RateLimit: &policy.RateLimit{
			PerSecond: local, Burst: local / 10, Shared: store, Lease: 10, FailOpen: failOpen,
		}},
		Observer: &policy.Observer{StoreTransition: func(e policy.StoreTransition) {
			mu.Lock()
			moves = append(moves, move{time.Now(), e.From, e.To, e.Err})
			mu.Unlock()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}

	var calls []call
	stop := make(chan struct{})
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		calls = drive(t, stop, func() (bool, bool, error) { return roundTrip(tr) })
	}()

	start := time.Now()
	time.Sleep(time.Second)
	failed := time.Now()
	if hang {
		s.freeze()
	} else {
		s.kill()
	}
	time.Sleep(time.Second)
	if hang {
		s.thaw()
	} else {
		s.restart()
	}
	back := time.Now()
	// The store is back when the transport hears so: wait for that, and
	// then for the 1.5s the timing checks look at.
	for deadline := back.Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		n := len(moves)
		ok := n > 0 && slices.ContainsFunc(moves, func(m move) bool { return m.to == policy.StoreUp && m.at.After(failed) })
		seen := slices.Clone(moves)
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store was not back a minute after Redis: transitions %+v", seen)
		}
	}
	time.Sleep(time.Until(back.Add(1500 * time.Millisecond)))
	close(stop)
	<-driven
	time.Sleep(2 * timeout) // the last ask answers

	mu.Lock()
	defer mu.Unlock()
	failing := policy.StoreRefusing
	if failOpen {
		failing = policy.StoreFallback
	}
	down, up, err := outage(moves, failed, failing)
	if err != nil {
		t.Fatal(err)
	}
	if timing() && len(moves) != 2 {
		t.Errorf("transitions %+v, want up→%v, %v→up", moves, failing, failing)
	}

	// The failure is seen by the first ask after it, within StoreTimeout.
	asks := store.all()
	i := slices.IndexFunc(asks, func(a ask) bool { return a.start.After(failed) })
	if i < 0 {
		t.Fatal("no ask after the failure")
	}
	first := asks[i]
	took := first.end.Sub(first.start)
	t.Logf("first ask %v after the failure, failed after %v (%v); the observer heard it %v after the failure",
		first.start.Sub(failed).Round(time.Millisecond), took.Round(time.Millisecond), first.err, down.at.Sub(failed).Round(time.Millisecond))
	if first.err == nil || took > bound(timeout) {
		t.Errorf("first ask after the failure: %v after %v, want an error within %v", first.err, took, bound(timeout))
	}

	// No call waits on the store longer than StoreTimeout; the scheduler
	// of a busy machine may add a little, or, without timing(), a lot,
	// but less than the outage's second.
	var longest time.Duration
	over := 0
	for _, c := range calls {
		longest = max(longest, c.took)
		if c.took > timeout {
			over++
		}
	}
	t.Logf("%d calls, longest %v, %d over StoreTimeout (%v)", len(calls), longest.Round(time.Microsecond), over, timeout)
	if longest > bound(timeout) {
		t.Errorf("a call took %v, want at most %v (StoreTimeout is %v)", longest, bound(timeout), timeout)
	}

	// Rates: the shared limit before the failure and after its return,
	// the local one (or none) in between. Each span leaves out the first
	// 200ms after a change.
	rate := func(from, to time.Time) (float64, int) { return admittedRate(calls, from, to) }
	settle := 200 * time.Millisecond
	before, inBefore := rate(start.Add(settle), failed)
	// Redis may answer before restart returns: the span ends at whichever
	// came first, the restart or the transition back.
	during, inDown := rate(down.at.Add(settle), minTime(back, up.at))
	after, inAfter := rate(up.at.Add(settle), calls[len(calls)-1].at)
	t.Logf("admitted a second: %.0f before, %.0f while Redis was down (%d calls), %.0f after; back %v after Redis",
		before, during, inDown, after, up.at.Sub(back).Round(time.Millisecond))
	within := func(what string, got, want float64) {
		if timing() && (got < 0.8*want || got > 1.2*want) {
			t.Errorf("%s: %.0f admitted a second, want %v ± 20%%", what, got, want)
		}
	}
	within("Redis up", before, shared)
	within("Redis back", after, shared)
	// The shared limit is never exceeded: its burst and a lease aside,
	// and, with FailOpen, what the local bucket admits while an ask that
	// timed out on a busy machine has the store failing outside the
	// outage.
	for _, span := range []struct {
		what     string
		from, to time.Time
		n        int
	}{{"Redis up", start.Add(settle), failed, inBefore}, {"Redis back", up.at.Add(settle), calls[len(calls)-1].at, inAfter}} {
		most := int(shared*span.to.Sub(span.from).Seconds()) + 10 + 10
		fallback := 0
		if failOpen {
			fallback = localAdmits(moves, down, span.from, span.to, local)
		}
		t.Logf("%s: %d calls admitted; the shared limit's %d (with its burst and a lease), and %d of the local bucket's while the store was failing (%d transitions in all)",
			span.what, span.n, most, fallback, len(moves))
		if span.n > most+fallback {
			t.Errorf("%s: %d calls admitted, more than the shared limit's %d (with its burst and a lease) and the local bucket's %d while the store was failing",
				span.what, span.n, most, fallback)
		}
	}
	if inAfter == 0 {
		t.Errorf("no call admitted after Redis was back")
	}
	if failOpen {
		within("Redis down, FailOpen", during, local)
		if inDown == 0 {
			t.Errorf("Redis down, FailOpen: no call admitted")
		}
	} else if inDown > 0 {
		t.Errorf("Redis down, failing closed: %d calls admitted, want none", inDown)
	}
	if d := up.at.Sub(back); timing() && d > time.Second {
		t.Errorf("the shared limit was back %v after Redis, want within a second", d)
	}
	if !failOpen {
		for _, c := range calls {
			if !c.admitted && !c.rateLimited {
				t.Fatalf("a refusal that is not ErrRateLimited at %v", c.at.Sub(start))
			}
		}
	}
}

// bound is how long a wait of d may take: twice d with timing(), as the
// scheduler may add a little; ten times without, and less than the
// outages of the failover tests, which a wait that is not bounded by d
// would last.
func bound(d time.Duration) time.Duration {
	if timing() {
		return 2 * d
	}
	return 10 * d
}

// outage returns the transitions that began and ended the store's outage
// that began at failed: the up→failing of the first failing spell that
// lasted past it, and the failing→up that ended that spell. The
// transitions must alternate, up→failing and failing→up: a busy machine
// may time out an ask while the store is up, before or after the outage,
// and add a pair.
func outage(moves []move, failed time.Time, failing policy.StoreState) (down, up move, err error) {
	k := -1
	for i, m := range moves {
		want := move{from: policy.StoreUp, to: failing}
		if i%2 == 1 {
			want = move{from: failing, to: policy.StoreUp}
		}
		if m.from != want.from || m.to != want.to {
			return down, up, fmt.Errorf("transitions %+v: the %d. is %v→%v, want %v→%v", moves, i+1, m.from, m.to, want.from, want.to)
		}
		// The failing spell that lasted past the failure: a busy machine
		// may have begun it just before.
		if k < 0 && m.to == failing && (i+1 == len(moves) || moves[i+1].at.After(failed)) {
			k = i
		}
	}
	if k < 0 || k+1 == len(moves) {
		return down, up, fmt.Errorf("transitions %+v: want up→%v after the failure, and →up after it", moves, failing)
	}
	return moves[k], moves[k+1], nil
}

// localAdmits is the most calls a local bucket of perSecond (and a
// tenth of that for its burst) admits within [from, to) during the
// store's failing spells other than the outage's, which begins with down:
// moves alternate up→failing and failing→up (outage checks it), and a
// last spell with no end lasts to the span's end.
func localAdmits(moves []move, down move, from, to time.Time, perSecond int) int {
	n := 0
	for i := 0; i < len(moves); i += 2 {
		if moves[i].at.Equal(down.at) {
			continue
		}
		end := to
		if i+1 < len(moves) {
			end = minTime(moves[i+1].at, to)
		}
		begin := moves[i].at
		if begin.Before(from) {
			begin = from
		}
		if end.After(begin) {
			n += perSecond/10 + int(math.Ceil(float64(perSecond)*end.Sub(begin).Seconds()))
		}
	}
	return n
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
