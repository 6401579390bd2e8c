//go:build unix

package redisrate

import (
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
// (SIGSTOP) for that second. With FailOpen the calls go on at the local
// rate, 300 a second, from the first ask after the failure, which fails
// within StoreTimeout; without it they are refused with ErrRateLimited.
// No call waits longer than StoreTimeout, the Observer hears one
// transition each way, and the shared limit is back within a second of
// Redis.
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
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-driven
	time.Sleep(2 * timeout) // the last ask answers

	mu.Lock()
	defer mu.Unlock()
	failing := policy.StoreRefusing
	if failOpen {
		failing = policy.StoreFallback
	}
	if len(moves) != 2 || moves[0].from != policy.StoreUp || moves[0].to != failing ||
		moves[1].from != failing || moves[1].to != policy.StoreUp {
		t.Fatalf("transitions %+v, want up→%v, %v→up", moves, failing, failing)
	}
	down, up := moves[0], moves[1]

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
	if first.err == nil || took > 2*timeout {
		t.Errorf("first ask after the failure: %v after %v, want an error within StoreTimeout (%v)", first.err, took, timeout)
	}

	// No call waits on the store longer than StoreTimeout; the scheduler
	// of a busy machine may add a little.
	var longest time.Duration
	over := 0
	for _, c := range calls {
		longest = max(longest, c.took)
		if c.took > timeout {
			over++
		}
	}
	t.Logf("%d calls, longest %v, %d over StoreTimeout (%v)", len(calls), longest.Round(time.Microsecond), over, timeout)
	if longest > 2*timeout {
		t.Errorf("a call took %v, want at most StoreTimeout (%v)", longest, timeout)
	}

	// Rates: the shared limit before the failure and after its return,
	// the local one (or none) in between. Each span leaves out the first
	// 200ms after a change.
	rate := func(from, to time.Time) (float64, int) { return admittedRate(calls, from, to) }
	settle := 200 * time.Millisecond
	before, _ := rate(start.Add(settle), failed)
	// Redis may answer before restart returns: the span ends at whichever
	// came first, the restart or the transition back.
	during, inDown := rate(down.at.Add(settle), minTime(back, up.at))
	after, _ := rate(up.at.Add(settle), calls[len(calls)-1].at)
	t.Logf("admitted a second: %.0f before, %.0f while Redis was down (%d calls), %.0f after; back %v after Redis",
		before, during, inDown, after, up.at.Sub(back).Round(time.Millisecond))
	within := func(what string, got, want float64) {
		if got < 0.8*want || got > 1.2*want {
			t.Errorf("%s: %.0f admitted a second, want %v ± 20%%", what, got, want)
		}
	}
	within("Redis up", before, shared)
	within("Redis back", after, shared)
	if failOpen {
		within("Redis down, FailOpen", during, local)
	} else if inDown > 0 {
		t.Errorf("Redis down, failing closed: %d calls admitted, want none", inDown)
	}
	if d := up.at.Sub(back); d > time.Second {
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

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
