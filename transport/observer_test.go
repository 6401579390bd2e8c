package transport

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

type callMark struct{}

// TestEveryEventCarriesTheCallersContext fires every kind of event the
// transport reports, hedge legs and transitions included, and checks by
// reflection that each carries the context of the call it belongs to, not
// a leg's internal one: an event struct added without a Context, or a call
// site that forgets it, fails here.
func TestEveryEventCarriesTheCallersContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[string]int{}
		var bad []string
		o := &policy.Observer{}
		v := reflect.ValueOf(o).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			ft := v.Field(i).Type()
			if ft.Kind() != reflect.Func || ft.NumIn() != 1 || ft.In(0).Kind() != reflect.Struct {
				continue // Attach
			}
			if _, ok := ft.In(0).FieldByName("Context"); !ok {
				t.Errorf("%s's event %v has no Context", name, ft.In(0))
				continue
			}
			v.Field(i).Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
				ctx, _ := args[0].FieldByName("Context").Interface().(context.Context)
				mu.Lock()
				defer mu.Unlock()
				seen[name]++
				if ctx == nil || ctx.Value(callMark{}) == nil {
					bad = append(bad, name)
				}
				return nil
			}))
		}
		var slowOnce sync.Once
		base := &slowRT{latency: func(_ int64, r *http.Request) (time.Duration, int) {
			switch i := r.Context().Value(callMark{}).(int); {
			case i == 30:
				d := 10 * time.Millisecond
				slowOnce.Do(func() { d = time.Second }) // the first leg: hedged, loses
				return d, 200
			case i >= 32 && i < 40:
				return 10 * time.Millisecond, 503 // trips the breaker
			case i >= 40:
				return 100 * time.Millisecond, 200 // ten times slower: the limit shrinks
			}
			return 10 * time.Millisecond, 200
		}}
		set := policy.Set{
			Retry:   &policy.Retry{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Hedge:   &policy.Hedge{},
			Breaker: &policy.Breaker{ConsecutiveFailures: 2, OpenFor: time.Minute},
			Limiter: &policy.Limiter{InitialLimit: 5},
		}
		tr := mustNew(t, Config{Base: base, Policies: set, Observer: o})
		call := func(i int, hdr string) {
			ctx := context.WithValue(t.Context(), callMark{}, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://up.test/", nil)
			if hdr != "" {
				req.Header.Set("Resilix-Priority", hdr)
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		for i := range 30 {
			call(i, "")
		}
		call(30, "")     // hedged: started, won, the loser discarded
		call(31, "bulk") // not hedged: suppressed for its priority
		for i := 32; i < 40; i++ {
			call(i, "no-such-priority") // malformed; 503s retried, the breaker trips, retries skipped
		}
		time.Sleep(2 * time.Minute) // the breaker closes again
		for i := 40; i < 100; i++ {
			call(i, "")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Errorf("events without the caller's context: %v", bad)
		}
		for _, name := range []string{"CallDone", "AttemptDone", "Refused", "RetrySkipped", "HedgeStarted",
			"HedgeWon", "HedgeSuppressed", "BreakerTransition", "LimitTransition", "MalformedHeader"} {
			if seen[name] == 0 {
				t.Errorf("the scenario fired no %s", name)
			}
		}
	})
}
