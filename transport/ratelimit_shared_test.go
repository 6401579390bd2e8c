package transport

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// memStore is a policy.SharedLimiter in memory that grants every ask after
// a millisecond, or fails while down.
type memStore struct {
	mu   sync.Mutex
	down bool
	keys []string
}

func (s *memStore) Take(ctx context.Context, key string, n int) (int, time.Duration, error) {
	select {
	case <-time.After(time.Millisecond):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, key)
	if s.down {
		return 0, 0, errors.New("store down")
	}
	return n, 0, nil
}

func (s *memStore) setDown(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

// TestSharedRateLimit runs a shared rate limit through the transport: the
// store is asked for the key's name, leased tokens show in Measured, a
// failing store is one transition for the Observer and refusals that are
// ErrRateLimited, and the store's return is one more transition.
func TestSharedRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type traceKey struct{}
		store := &memStore{}
		var mu sync.Mutex
		var moves []string
		tr := mustNew(t, Config{
			Base: okBase{},
			Policies: policy.Set{RateLimit: &policy.RateLimit{
				PerSecond: 10, Burst: 1, Shared: store, Lease: 5,
			}},
			Observer: &policy.Observer{StoreTransition: func(e policy.StoreTransition) {
				mu.Lock()
				defer mu.Unlock()
				if e.Key != "api.test" || e.Context == nil || e.Context.Value(traceKey{}) != "t1" {
					t.Errorf("transition %+v: want key api.test and the calling request's context values", e)
				}
				moves = append(moves, e.From.String()+"→"+e.To.String())
			}},
		})
		ctx := context.WithValue(t.Context(), traceKey{}, "t1")
		call := func() error {
			req := mustRequest(t, "http://api.test/").WithContext(ctx)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		measured := func() (policy.StoreState, int) {
			m := tr.Measured("api.test")
			return m.RateLimitStore, m.RateLimitLeased
		}

		if err := call(); err != nil {
			t.Fatalf("first call: %v", err)
		}
		if state, leased := measured(); state != policy.StoreUp || leased != 4 {
			t.Fatalf("after one call of a lease of 5: Measured store %v, leased %d; want up, 4", state, leased)
		}
		store.setDown(true)
		for i := range 2 { // the second asks for the next lease, which fails
			if err := call(); err != nil {
				t.Fatalf("call %d with leased tokens: %v", i, err)
			}
		}
		time.Sleep(time.Millisecond) // the ask's latency
		synctest.Wait()              // and its answer recorded
		if state, leased := measured(); state != policy.StoreRefusing || leased != 2 {
			t.Fatalf("store down: Measured store %v, leased %d; want refusing, 2", state, leased)
		}
		for i := range 2 {
			if err := call(); err != nil {
				t.Fatalf("leased token %d while the store is down: %v", i, err)
			}
		}
		err := call()
		var rej *policy.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, policy.ErrRateLimited) || rej.Gate != policy.GateRateLimit || rej.RetryAfter <= 0 {
			t.Fatalf("store down, no lease: %v, want ErrRateLimited from the rate limit with a RetryAfter", err)
		}

		store.setDown(false)
		time.Sleep(600 * time.Millisecond) // past the backoff
		if err := call(); err == nil {
			t.Fatal("admitted while the store was last seen failing; the ask goes in the background")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if err := call(); err != nil {
			t.Fatalf("store back: %v", err)
		}
		if state, _ := measured(); state != policy.StoreUp {
			t.Fatalf("store back: Measured store %v, want up", state)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"up→refusing", "refusing→up"}; !cmp.Equal(moves, want) {
			t.Errorf("transitions %q, want %q", moves, want)
		}
		for _, k := range store.keys {
			if k != "api.test" {
				t.Errorf("the store was asked for %q, want the key api.test", k)
			}
		}
	})
}

// TestSharedRateLimitFieldsNeedAStore: New names a shared field set
// without a store, and a local rate limit's snapshot has no store.
func TestSharedRateLimitFieldsNeedAStore(t *testing.T) {
	_, err := New(Config{Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: 1, Lease: 3, FailOpen: true}}})
	want := []string{
		"transport: Policies: policy: RateLimit.Lease is 3 but RateLimit.Shared is nil, so nothing is leased",
		"transport: Policies: policy: RateLimit.FailOpen is set but RateLimit.Shared is nil, so there is no store to fail",
	}
	if err == nil || !cmp.Equal(strings.Split(err.Error(), "\n"), want) {
		t.Fatalf("New = %v, want\n%s", err, strings.Join(want, "\n"))
	}
	tr := mustNew(t, Config{Base: okBase{}, Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: 100}}})
	resp, err := tr.RoundTrip(mustRequest(t, "http://api.test/"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if m := tr.Measured("api.test"); !m.HasRateLimit || m.RateLimitStore != 0 || m.RateLimitLeased != 0 {
		t.Fatalf("local rate limit: Measured %+v, want a rate limit with no store", m)
	}
}

// gatedStore is a policy.SharedLimiter in memory whose asks answer at once
// while it is open, and otherwise wait for it to open or for their
// context (StoreTimeout) to end. It counts the asks by key.
type gatedStore struct {
	mu   sync.Mutex
	open chan struct{} // closed: open
	asks map[string]int
}

func (s *gatedStore) Take(ctx context.Context, key string, n int) (int, time.Duration, error) {
	s.mu.Lock()
	s.asks[key]++
	open := s.open
	s.mu.Unlock()
	select {
	case <-open:
		return n, 0, nil
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// TestEvictionWithALeaseAskInFlight: a call spending a leased token starts
// the ask for the next lease on a goroutine of its own and returns; its
// scope is then idle and may be evicted while the ask is still waiting on
// the store. The ask ends within StoreTimeout whatever became of its scope
// (the bubble ends only when every goroutine has), what it brings back is
// lost with the scope (at most one lease), and the key's next call starts
// afresh: a new scope, a new lease, nothing carried over.
func TestEvictionWithALeaseAskInFlight(t *testing.T) {
	for _, answer := range []string{"times out", "answers"} {
		t.Run("the ask "+answer, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &gatedStore{open: make(chan struct{}), asks: map[string]int{}}
				close(store.open)
				// Only a.test is rate limited: b.test and c.test, which
				// take its place, ask no store.
				tr := mustNew(t, Config{Base: okBase{}, MaxKeys: 2, PerKey: map[string]policy.Set{"a.test": {RateLimit: &policy.RateLimit{
					PerSecond: 100, Burst: 1, Shared: store, Lease: 4, StoreTimeout: 50 * time.Millisecond,
				}}}})
				call := func(host string) {
					t.Helper()
					if err := getClose(t, tr, "http://"+host+"/"); err != nil {
						t.Fatalf("%s: %v", host, err)
					}
				}
				call("a.test") // the first lease: 4 tokens, one spent
				synctest.Wait()
				store.mu.Lock()
				store.open = make(chan struct{}) // asks wait from now on
				store.mu.Unlock()
				call("a.test") // 2 left: the next lease is asked for
				synctest.Wait()
				if got := store.asks["a.test"]; got != 2 {
					t.Fatalf("%d asks for a.test, want the first lease and the next", got)
				}
				// A moment apart, so that a.test is the least recently
				// used (in a bubble, time stands still between calls).
				time.Sleep(time.Millisecond)
				call("b.test")
				time.Sleep(time.Millisecond)
				call("c.test")
				if tr.Measured("a.test").Known {
					t.Fatal("a.test's scope was kept past MaxKeys with no call in it")
				}
				if answer == "answers" {
					close(store.open) // 2 ms into the ask's StoreTimeout of 50 ms
				}
				time.Sleep(time.Second) // every ask has ended
				synctest.Wait()
				store.mu.Lock()
				select {
				case <-store.open:
				default:
					close(store.open)
				}
				store.mu.Unlock()
				call("a.test")
				m := tr.Measured("a.test")
				if m.RateLimitStore != policy.StoreUp || m.RateLimitLeased != 3 {
					t.Errorf("a.test after its scope was evicted: store %v, %d leased; want up and a fresh lease of 4, one spent", m.RateLimitStore, m.RateLimitLeased)
				}
				if got := store.asks["a.test"]; got != 3 {
					t.Errorf("%d asks for a.test, want 3 (the evicted scope's two, the new scope's one)", got)
				}
			})
		})
	}
}
