//go:build unix

package redisrate

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
)

// TestPeerGrants is the package doc's reason for a script of its own, as
// a figure: under TestTakeIsExact's load (contend), this package's Take
// and github.com/go-redis/redis_rate/v10's AllowAtMost, each on a bucket
// of its own on the same Redis, and how many tokens each granted against
// what the server's clock made. AllowAtMost charges the bucket for the
// fraction of a token it does not grant, so it falls short by up to a
// token for each partial grant; how far short depends on its rounding and
// the machine's timing, so this only prints the table. It runs with
// RESILIX_REDIS_PEER set to the number of runs (README.md), and skips
// otherwise: make test checks Take alone (TestTakeIsExact).
func TestPeerGrants(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("RESILIX_REDIS_PEER"))
	if runs < 1 {
		t.Skip("a figure, not a check: RESILIX_REDIS_PEER=3 go test -count=1 -run '^TestPeerGrants$' -v .")
	}
	s := startRedis(t)
	client := newClient(t, s.addr)
	l := mustNew(t, client, Limit{Rate: contendRate, Burst: contendBurst})
	peer := redis_rate.NewLimiter(client)
	peerLimit := redis_rate.Limit{Rate: contendRate, Burst: contendBurst, Period: time.Second}
	libraries := []struct {
		name string
		take func(ctx context.Context, key string, n int) (int, error)
	}{
		{"redisrate", func(ctx context.Context, key string, n int) (int, error) {
			g, _, err := l.Take(ctx, key, n)
			return g, err
		}},
		{"redis_rate", func(ctx context.Context, key string, n int) (int, error) {
			res, err := peer.AllowAtMost(ctx, key, peerLimit, n)
			if err != nil {
				return 0, err
			}
			return res.Allowed, nil
		}},
	}
	t.Logf("4 goroutines asking for 7, 9, 11 and 13 tokens of %d/s, burst %d, each library on a bucket of its own", contendRate, contendBurst)
	t.Logf("%-4s %-11s %8s %15s %6s %8s %16s", "run", "library", "granted", "clock made", "short", "partial", "short a partial")
	for run := 1; run <= runs; run++ {
		// Each run starts with the other library, so that neither always
		// has the warmer server.
		for i := range libraries {
			lib := libraries[(run+i)%len(libraries)]
			key := fmt.Sprintf("%s:%d", lib.name, run)
			c := contend(t, client, func(ctx context.Context, n int) (int, error) { return lib.take(ctx, key, n) })
			// short: the tokens granted below the least the clock made.
			short := max(c.lo-c.granted, 0)
			t.Logf("%-4d %-11s %8d %15s %6d %8d %16.2f", run, lib.name, c.granted,
				fmt.Sprintf("%d to %d", c.lo, c.hi), short, c.partial, float64(short)/float64(c.partial))
		}
	}
}
