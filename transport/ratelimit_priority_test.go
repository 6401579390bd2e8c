package transport

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// rateFlood is the outcome of a flood of a RateLimit through the
// transport.
type rateFlood struct {
	critical, criticalOK int64 // paced calls, and those admitted
	bulkOK               int64 // flood calls admitted
	refused, late        int64 // calls refused, and those whose deadline ended them, of either kind
	upstream             int64 // requests the upstream saw in the 6s
	after                int64 // and after them, from calls still waiting then
}

// floodRateLimit runs, in a bubble over an in-memory upstream that answers
// in a millisecond, a RateLimit of 40/s, burst 5, MaxWait 1s, for 6s of
// virtual time: Critical calls at 25/s, each with a deadline of 1s and
// none tagged, and bulk callers that call with the priority bulk in a
// closed loop, each call with a deadline of 1s, sleeping the RetryAfter
// of a refusal (a millisecond at least).
func floodRateLimit(t *testing.T, bulkCallers int, bulk shedding.Priority) rateFlood {
	const (
		duration = 6 * time.Second
		critRate = 25
	)
	var f rateFlood
	synctest.Test(t, func(t *testing.T) {
		u := httptestutil.NewUpstream(httptestutil.Options{Latency: httptestutil.Constant(time.Millisecond)})
		tr := mustNew(t, Config{
			Base:     u.RoundTripper(),
			Policies: policy.Set{RateLimit: &policy.RateLimit{PerSecond: 40, Burst: 5, MaxWait: time.Second}},
		})
		call := func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			resp, err := get(t, ctx, tr, "http://a.test/")
			if err != nil {
				return err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return nil
		}
		end := time.Now().Add(duration)
		var wg sync.WaitGroup
		for range bulkCallers {
			wg.Go(func() {
				ctx := context.Background() // a Critical flood carries no priority
				if bulk != shedding.Critical {
					ctx = shedding.WithPriority(ctx, bulk)
				}
				for time.Now().Before(end) {
					err := call(ctx)
					var rej *policy.RejectedError
					switch {
					case err == nil:
						atomic.AddInt64(&f.bulkOK, 1)
					case errors.As(err, &rej):
						atomic.AddInt64(&f.refused, 1)
						time.Sleep(max(rej.RetryAfter, time.Millisecond))
					case errors.Is(err, context.DeadlineExceeded):
						atomic.AddInt64(&f.late, 1)
					default:
						t.Errorf("flood call: %v", err)
						return
					}
				}
			})
		}
		tick := time.NewTicker(time.Second / critRate)
		defer tick.Stop()
		for now := time.Now(); now.Before(end); now = <-tick.C {
			f.critical++
			wg.Go(func() {
				switch err := call(context.Background()); {
				case err == nil:
					atomic.AddInt64(&f.criticalOK, 1)
				case errors.Is(err, policy.ErrRateLimited):
					atomic.AddInt64(&f.refused, 1)
				case errors.Is(err, context.DeadlineExceeded):
					atomic.AddInt64(&f.late, 1)
				default:
					t.Errorf("paced call at %v: %v", now.Sub(end.Add(-duration)), err)
				}
			})
		}
		synctest.Wait() // what arrives at the 6s instant has arrived
		f.upstream = u.Stats().Requests
		wg.Wait()
		f.after = u.Stats().Requests - f.upstream
	})
	return f
}

// TestRateLimitPriorityFlood: Bulk callers flooding a RateLimit of 40/s
// do not take what Critical calls at 25/s need, every Critical call is
// admitted, Bulk gets at least 80% of the 15/s Critical leaves, and the
// upstream sees no more than the limit allows.
func TestRateLimitPriorityFlood(t *testing.T) {
	f := floodRateLimit(t, 16, shedding.Bulk)
	t.Logf("%+v", f)
	const seconds = 6
	if f.criticalOK != f.critical {
		t.Errorf("%d of %d Critical calls admitted, want all", f.criticalOK, f.critical)
	}
	if min := int64(0.8 * 15 * seconds); f.bulkOK < min {
		t.Errorf("Bulk admitted %d times in %ds, want at least %d (80%% of 15/s)", f.bulkOK, seconds, min)
	}
	if max := int64(40*seconds + 5); f.upstream > max {
		t.Errorf("the upstream saw %d requests in %ds, want at most %d (40/s and the burst)", f.upstream, seconds, max)
	}
}

// TestRateLimitAllCriticalFlood: the same flood, untagged, is the bucket
// of a RateLimit without priorities: every call waits in it, first come
// first served, so the flood's 16 closed-loop callers put the paced calls
// behind them. The upstream sees the rate and the burst, every token
// used; the queue grows until calls are refused or run out of deadline,
// paced and flood calls alike, as they did before priorities.
func TestRateLimitAllCriticalFlood(t *testing.T) {
	f := floodRateLimit(t, 16, shedding.Critical)
	t.Logf("%+v", f)
	if want := int64(40*6 + 5); f.upstream < want-1 || f.upstream > want+1 {
		t.Errorf("the upstream saw %d requests in 6s, want %d (40/s and the burst, every token used, ±1 at the instants)", f.upstream, want)
	}
	if f.criticalOK == f.critical || f.refused+f.late == 0 {
		t.Errorf("every paced call admitted and none refused or late: the flood did not queue ahead of them")
	}
}
