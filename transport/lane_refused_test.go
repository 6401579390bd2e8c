package transport

import (
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestARefusedReplicaGetsOneAttemptPerDownFor: one of three replicas in
// Endpoints refuses every dial (killed, left in DNS), at 200 calls a
// second with fleetops' policies (Attempts 3, Retry, Hedge, Breaker, a
// 1 s per-attempt timeout). Its lane is out for a second after each
// refusal (the lane package's downFor), then gets one probe: over 7 s,
// at most 7 attempts, each a second or more after the last.
func TestARefusedReplicaGetsOneAttemptPerDownFor(t *testing.T) {
	const downFor = time.Second // internal/lane's
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		for _, a := range four[1:3] {
			f.serve(a, a[:1])
			f.reps[a[:1]].delay.Store(int64(5 * time.Millisecond))
		}
		var mu sync.Mutex
		var on []time.Time // the attempts' starts on a:80, the refusing one
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{
				Attempts: 3,
				Retry:    &policy.Retry{},
				Hedge:    &policy.Hedge{},
				Breaker:  &policy.Breaker{},
				Timeout:  &policy.Timeout{PerAttempt: time.Second},
				Replicas: &policy.Replicas{Endpoints: Static(four[:3]...)},
			},
			Observer: &policy.Observer{AttemptDone: func(a policy.AttemptInfo) {
				if a.Lane == four[0] {
					mu.Lock()
					on = append(on, time.Now().Add(-a.Latency))
					mu.Unlock()
				}
			}},
		})
		prime(t, rt, "http://api/")
		start := time.Now()
		var calls sync.WaitGroup
		for i := 0; time.Since(start) < 8*time.Second; i += 2 {
			for j := range 2 { // two at once, whose picks may race
				calls.Go(func() {
					if code, err := laneGet(t, rt, "http://api/", strconv.Itoa(i+j)); err != nil || code != 200 {
						t.Errorf("call %d: %d, %v", i+j, code, err)
					}
				})
			}
			time.Sleep(10 * time.Millisecond)
		}
		calls.Wait()
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(on, time.Time.Compare)
		from, to := start.Add(time.Second), start.Add(8*time.Second)
		n := 0
		for _, at := range on {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
		if most := int(to.Sub(from) / downFor); n > most {
			t.Errorf("%d attempts on the refusing replica over %v, want at most %d", n, to.Sub(from), most)
		}
		for i := 1; i < len(on); i++ {
			if d := on[i].Sub(on[i-1]); d < downFor {
				t.Errorf("attempts on the refusing replica at +%v and +%v, %v apart, want at least %v", on[i-1].Sub(start), on[i].Sub(start), d, downFor)
				break
			}
		}
		t.Logf("%d attempts on the refusing replica over %v, %d in all", n, to.Sub(from), len(on))
	})
}
