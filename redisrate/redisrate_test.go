//go:build unix

package redisrate

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// newClient returns a client of addr as the package doc recommends it,
// closed when the test ends.
func newClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

func mustNew(t testing.TB, c redis.UniversalClient, l Limit) *Limiter {
	t.Helper()
	lim, err := New(c, l)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

type take struct {
	granted int
	retry   time.Duration
}

func mustTake(t *testing.T, l *Limiter, key string, n int) take {
	t.Helper()
	g, r, err := l.Take(t.Context(), key, n)
	if err != nil {
		t.Fatalf("Take(%q, %d): %v", key, n, err)
	}
	return take{g, r}
}

// near reports whether got is within the milliseconds that pass between
// two commands of want, and never above it. (50ms, half of TestTake's
// token, so that a slow machine does not change what is granted either.)
func near(got, want time.Duration) bool { return got <= want && got > want-50*time.Millisecond }

// TestTake: the bucket starts full at Burst, grants what it holds and no
// more (a partial grant is exact, in whole tokens), says when the rest
// will be there, and an ask beyond Burst is an ask for Burst.
func TestTake(t *testing.T) {
	s := startRedis(t)
	l := mustNew(t, newClient(t, s.addr), Limit{Rate: 10, Burst: 5}) // a token every 100ms
	if got := mustTake(t, l, "a", 3); got != (take{3, 0}) {
		t.Fatalf("3 of a full bucket of 5: %+v, want all", got)
	}
	got := mustTake(t, l, "a", 4)
	if got.granted != 2 || !near(got.retry, 200*time.Millisecond) {
		t.Fatalf("4 of the 2 left: %+v, want 2 and the other 2 in 200ms", got)
	}
	got = mustTake(t, l, "a", 1)
	if got.granted != 0 || !near(got.retry, 100*time.Millisecond) {
		t.Fatalf("1 of none: %+v, want 0 and a token in 100ms", got)
	}
	if got := mustTake(t, l, "b", 9); got != (take{5, 0}) {
		t.Fatalf("9 of another key's full bucket of 5: %+v, want its 5 (Burst) and no wait", got)
	}
	time.Sleep(got.retry)
	if got := mustTake(t, l, "a", 1); got.granted != 1 {
		t.Fatalf("1 after the retry-after: %+v, want it", got)
	}
	if _, _, err := l.Take(t.Context(), "a", 0); err == nil {
		t.Fatal("Take of 0: no error")
	}
}

// TestTakeIsExact: goroutines asking for odd numbers at once, partial
// grants nearly every time, get exactly the rate and the burst between
// them: no token is lost to rounding, none is made up.
func TestTakeIsExact(t *testing.T) {
	s := startRedis(t)
	client := newClient(t, s.addr)
	l := mustNew(t, client, Limit{Rate: contendRate, Burst: contendBurst})
	c := contend(t, client, func(ctx context.Context, n int) (int, error) {
		g, _, err := l.Take(ctx, "k", n)
		return g, err
	})
	t.Logf("%d granted at %d/s (%d partial grants of %d asks); the server's clock gives %d to %d",
		c.granted, contendRate, c.partial, c.asks, c.lo, c.hi)
	if c.granted > c.hi || c.granted < c.lo {
		t.Errorf("%d granted, want %d to %d: every token the clock made, and no more", c.granted, c.lo, c.hi)
	}
}

// The limit contend's asks share: a token every 500µs. The burst is ten
// seconds of them, so that no stall of a busy machine, the test's or the
// server's, lets the bucket fill up and lose tokens while contend runs.
const contendRate, contendBurst = 2000, 20000

// contention is what contend saw.
type contention struct {
	// granted is every token granted after the first drain, the last
	// drain's included.
	granted int
	// lo and hi bound what the limit made meanwhile, by the server's
	// clock: from just after the first drain to just before the last,
	// and from just before the first to just after the last, a token
	// either way for the rounding.
	lo, hi  int
	asks    int
	partial int // grants of fewer tokens than asked, but some
}

// contend empties the bucket with an ask for all of it (it starts full),
// has four goroutines ask take for 7, 9, 11 and 13 tokens in a loop for
// half a second, and until they have had 100 partial grants (for at most
// 10s), then empties it again; it reads the server's clock (TIME) around
// both drains. Nothing in it depends on how fast the machine is.
func contend(t *testing.T, client *redis.Client, take func(ctx context.Context, n int) (int, error)) contention {
	t.Helper()
	clock := func() time.Time {
		now, err := client.Time(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now
	}
	drain := func() int {
		g, err := take(t.Context(), contendBurst)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	var (
		mu sync.Mutex
		c  contention
		wg sync.WaitGroup
	)
	before := clock()
	if g := drain(); g != contendBurst {
		t.Fatalf("the first ask for the whole bucket got %d, want %d", g, contendBurst)
	}
	from := clock()
	start := time.Now()
	for i := range 4 {
		wg.Go(func() {
			n := 7 + 2*i
			for {
				mu.Lock()
				done := time.Since(start) >= 500*time.Millisecond && c.partial >= 100 || time.Since(start) >= 10*time.Second
				mu.Unlock()
				if done {
					return
				}
				g, err := take(t.Context(), n)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				c.granted += g
				c.asks++
				if g > 0 && g < n {
					c.partial++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	to := clock()
	c.granted += drain()
	after := clock()
	c.lo = int(contendRate*to.Sub(from).Seconds()) - 1
	c.hi = int(contendRate*after.Sub(before).Seconds()) + 1
	if c.partial < 100 {
		t.Errorf("only %d partial grants in %v: the test does not test them", c.partial, time.Since(start))
	}
	return c
}

// TestKeys: the key is the prefix and the caller's key; another prefix is
// another bucket; the key expires when its bucket would be full again.
func TestKeys(t *testing.T) {
	s := startRedis(t)
	c := newClient(t, s.addr)
	ctx := t.Context()
	def := mustNew(t, c, Limit{Rate: 10, Burst: 2})
	mine := mustNew(t, c, Limit{Rate: 10, Burst: 2, Prefix: "app:quota:"})
	mustTake(t, def, "api.example.com", 2)
	if got := mustTake(t, mine, "api.example.com", 2); got.granted != 2 {
		t.Fatalf("another prefix: %+v, want its own full bucket", got)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := "app:quota:api.example.com resilix:rate:api.example.com"; strings.Join(sorted(keys), " ") != want {
		t.Fatalf("keys %q, want %q", keys, want)
	}
	ttl, err := c.PTTL(ctx, "resilix:rate:api.example.com").Result()
	if err != nil || ttl <= 0 || ttl > 201*time.Millisecond {
		t.Fatalf("PTTL = %v, %v; want at most the 200ms until the bucket of 2 is full", ttl, err)
	}
}

func sorted(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// TestTakeHonoursContext: an ask with a done context fails at once, with
// the context's error, and takes nothing.
func TestTakeHonoursContext(t *testing.T) {
	s := startRedis(t)
	l := mustNew(t, newClient(t, s.addr), Limit{Rate: 10, Burst: 1})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, _, err := l.Take(ctx, "k", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take with a cancelled context: %v, want context.Canceled", err)
	}
	if got := mustTake(t, l, "k", 1); got.granted != 1 {
		t.Fatalf("after a cancelled ask: %+v, want the bucket's token", got)
	}
}

// TestUniversalClients: the same limit works through a Ring and a client
// of a Redis Cluster (one node holding every slot).
func TestUniversalClients(t *testing.T) {
	t.Run("ring", func(t *testing.T) {
		s := startRedis(t)
		r := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s.addr}, ContextTimeoutEnabled: true})
		defer r.Close()
		l := mustNew(t, r, Limit{Rate: 10, Burst: 3})
		if got := mustTake(t, l, "k", 5); got.granted != 3 {
			t.Fatalf("through a Ring: %+v, want 3", got)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		if err := command(s.addr, "CLUSTER ADDSLOTSRANGE 0 16383", "+OK"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for command(s.addr, "SET ready 1", "+OK") != nil {
			if time.Now().After(deadline) {
				t.Fatal("the cluster did not come up")
			}
			time.Sleep(10 * time.Millisecond)
		}
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{s.addr}, ContextTimeoutEnabled: true})
		defer c.Close()
		l := mustNew(t, c, Limit{Rate: 10, Burst: 3})
		if got := mustTake(t, l, "k", 5); got.granted != 3 {
			t.Fatalf("through a ClusterClient: %+v, want 3", got)
		}
	})
}
