package gate

import (
	"net/http"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// answer is a response of the given status, with a Retry-After when
// retryAfter is not empty.
func answer(status int, retryAfter string) *http.Response {
	r := &http.Response{StatusCode: status, Header: http.Header{}}
	if retryAfter != "" {
		r.Header.Set("Retry-After", retryAfter)
	}
	return r
}

// pushedBack makes one Critical attempt at now answered by resp, and
// returns what the answer armed.
func pushedBack(t *testing.T, th *Throttler, now time.Time, resp *http.Response) Pushback {
	t.Helper()
	if d := th.Admit(now, shedding.Critical, ""); !d.OK {
		t.Fatalf("the Critical attempt that gets the answer was refused: %+v", d)
	}
	return th.Done(now, policy.Failure, false, resp)
}

var allPriorities = [...]shedding.Priority{shedding.Critical, shedding.Degraded, shedding.BestEffort, shedding.Bulk}

// TestPushbackStopHoldsBackBulkAndBestEffort: a 503 with Retry-After: 2
// refuses every Bulk and BestEffort attempt for exactly 2s, each with what
// is left of the wait, and admits every Degraded and Critical one; the
// hold ends at the nanosecond.
func TestPushbackStopHoldsBackBulkAndBestEffort(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	t0 := thStart.Add(time.Second)
	if got, want := pushedBack(t, th, t0, answer(503, "2")), (Pushback{StatusCode: 503, RetryAfter: 2 * time.Second}); got != want {
		t.Fatalf("Done returned %+v, want %+v", got, want)
	}
	for _, at := range []time.Duration{0, time.Millisecond, 1500 * time.Millisecond, 2*time.Second - 1} {
		now := t0.Add(at)
		for _, p := range allPriorities {
			for range 50 { // not one Bulk in 50: a stop is not a probability
				d := th.Admit(now, p, "")
				if p <= shedding.Degraded {
					if !d.OK || d.HeldBack {
						t.Fatalf("at +%v: %v refused: %+v", at, p, d)
					}
					th.Done(now, policy.Success, true, answer(200, ""))
					continue
				}
				if d.OK || !d.HeldBack || d.RetryAfter != 2*time.Second-at {
					t.Fatalf("at +%v: %v got %+v, want held back with RetryAfter %v", at, p, d, 2*time.Second-at)
				}
			}
		}
		if h := th.Hold(now); h != (Hold{Left: 2*time.Second - at, Stopped: true}) {
			t.Errorf("at +%v: Hold = %+v", at, h)
		}
	}
	end := t0.Add(2 * time.Second)
	for _, p := range allPriorities {
		if d := th.Admit(end, p, ""); !d.OK || d.HeldBack {
			t.Errorf("when the Retry-After has run out: %v got %+v, want admitted", p, d)
		}
	}
	if h := th.Hold(end); h != (Hold{}) {
		t.Errorf("after the hold: Hold = %+v, want none", h)
	}
	// Held-back attempts are the server's word, not requests of the
	// estimate: 400 of them did not make it throttle.
	if p := th.Pressure(end); p != 0 {
		t.Errorf("Pressure = %v after the hold, want 0", p)
	}
}

// TestPushbackArmsOnlyWithinBounds: only a 429 or 503 whose Retry-After
// asks for a positive wait no longer than the bound holds anything back.
func TestPushbackArmsOnlyWithinBounds(t *testing.T) {
	date := thStart.Add(3 * time.Second).Format(http.TimeFormat)
	for _, tc := range []struct {
		name string
		cfg  policy.Throttler
		resp *http.Response
		want time.Duration // the wait armed; 0: nothing
	}{
		{"503, 1s", policy.Throttler{}, answer(503, "1"), time.Second},
		{"429, 1s", policy.Throttler{}, answer(429, "1"), time.Second},
		{"an HTTP-date", policy.Throttler{}, answer(503, date), 3 * time.Second},
		{"the bound itself: 10s", policy.Throttler{}, answer(503, "10"), 10 * time.Second},
		{"beyond the bound: 11s", policy.Throttler{}, answer(503, "11"), 0},
		{"beyond MaxPushback", policy.Throttler{MaxPushback: 2 * time.Second}, answer(429, "3"), 0},
		{"within MaxPushback", policy.Throttler{MaxPushback: time.Minute}, answer(429, "30"), 30 * time.Second},
		{"pushback off", policy.Throttler{MaxPushback: -1}, answer(503, "1"), 0},
		{"a bare 503", policy.Throttler{}, answer(503, ""), 0},
		{"a bare 429", policy.Throttler{}, answer(429, ""), 0},
		{"a zero wait", policy.Throttler{}, answer(503, "0"), 0},
		{"a date in the past", policy.Throttler{}, answer(503, thStart.Add(-time.Hour).Format(http.TimeFormat)), 0},
		{"malformed", policy.Throttler{}, answer(429, "soon"), 0},
		{"negative", policy.Throttler{}, answer(429, "-1"), 0},
		{"absurd", policy.Throttler{}, answer(429, "99999999999999999999"), 0},
		{"a 502 with a Retry-After", policy.Throttler{}, answer(502, "1"), 0},
		{"a 500 with a Retry-After", policy.Throttler{}, answer(500, "1"), 0},
		{"a 200 with a Retry-After", policy.Throttler{}, answer(200, "1"), 0},
		{"no response", policy.Throttler{}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newThrottler(tc.cfg, thStart, 1)
			got := pushedBack(t, th, thStart, tc.resp)
			if got.RetryAfter != tc.want || got.Armed() != (tc.want > 0) {
				t.Fatalf("Done returned %+v, want a wait of %v", got, tc.want)
			}
			held := 0
			for range 10 {
				if d := th.Admit(thStart, shedding.Bulk, ""); d.HeldBack {
					held++
				}
			}
			if tc.want == 0 && held > 0 {
				t.Errorf("%d of 10 Bulk attempts held back after an answer that should arm nothing", held)
			}
			if tc.want > 0 && held == 0 {
				t.Error("no Bulk attempt held back")
			}
			if h := th.Hold(thStart); h.Left != tc.want {
				t.Errorf("Hold = %+v, want %v left", h, tc.want)
			}
		})
	}
}

// TestPushbackBound: the bound comes from the Set's Retry unless
// MaxPushback says otherwise, and is Retry's default without one.
func TestPushbackBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  policy.Throttler
		r    *policy.Retry
		want time.Duration
	}{
		{"no Retry: Retry's default", policy.Throttler{}, nil, 10 * time.Second},
		{"the zero Retry", policy.Throttler{}, &policy.Retry{}, 10 * time.Second},
		{"Retry.MaxRetryAfter", policy.Throttler{}, &policy.Retry{MaxRetryAfter: 3 * time.Second}, 3 * time.Second},
		{"Retry ignores Retry-After: off", policy.Throttler{}, &policy.Retry{MaxRetryAfter: -1}, -1},
		{"MaxPushback wins", policy.Throttler{MaxPushback: time.Minute}, &policy.Retry{MaxRetryAfter: 3 * time.Second}, time.Minute},
		{"MaxPushback off", policy.Throttler{MaxPushback: -1}, &policy.Retry{}, -1},
	} {
		if got := tc.cfg.PushbackBound(tc.r); got != tc.want {
			t.Errorf("%s: PushbackBound = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPushbackPaceEndsOnTime: a 429's hold lets Critical and Degraded
// through, paces Bulk and BestEffort (the first goes, the next is refused
// with a RetryAfter between 1ms and what is left), and ends exactly when
// the last 429's Retry-After runs out.
func TestPushbackPaceEndsOnTime(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	t0 := thStart.Add(time.Second)
	pushedBack(t, th, t0, answer(429, "1"))
	now := t0.Add(time.Millisecond)
	if d := th.Admit(now, shedding.Bulk, ""); !d.OK {
		t.Fatalf("the first Bulk attempt of a pace was refused: %+v", d)
	}
	d := th.Admit(now, shedding.BestEffort, "")
	if d.OK || !d.HeldBack || d.RetryAfter < time.Millisecond || d.RetryAfter > time.Second-time.Millisecond {
		t.Fatalf("the next BestEffort at the same instant: %+v, want held back for 1ms to 999ms", d)
	}
	for _, p := range []shedding.Priority{shedding.Critical, shedding.Degraded} {
		for range 100 {
			d := th.Admit(now, p, "")
			if !d.OK {
				t.Fatalf("%v refused while paced: %+v", p, d)
			}
			th.Done(now, policy.Success, true, answer(200, ""))
		}
	}
	// A second 429 half a second in extends the hold to 1.5s.
	pushedBack(t, th, t0.Add(500*time.Millisecond), answer(429, "1"))
	last := t0.Add(1500*time.Millisecond - 1)
	if h := th.Hold(last); h.Left != 1 || h.Stopped {
		t.Errorf("a nanosecond before the end: Hold = %+v, want 1ns left, paced", h)
	}
	end := t0.Add(1500 * time.Millisecond)
	for i := range 100 {
		if d := th.Admit(end, shedding.Bulk, ""); !d.OK || d.HeldBack {
			t.Fatalf("Bulk attempt %d when the hold has run out: %+v", i, d)
		}
	}
}

// tokenBucket is a backend that admits rate requests a second with bursts
// of burst, as nginx's limit_req and most APIs' rate limits do, and
// answers the rest 429 with Retry-After: 1.
type tokenBucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func (b *tokenBucket) serve(now time.Time) *http.Response {
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+b.rate*now.Sub(b.last).Seconds())
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return answer(200, "")
	}
	return answer(429, "1")
}

// paceRun is what paceDrive counted over the part of a run it tallies.
type paceRun struct {
	sent, accepted, refused int // on the wire; accepted ones; held back
}

// paceDrive offers attempts of priority prio every 100µs (10,000 a second,
// 50 times the rate) to th from thStart+from to thStart+to, each answered
// at once by b, and counts what happened from thStart+tally on. An attempt
// held back is not sent.
func paceDrive(th *Throttler, b *tokenBucket, prio shedding.Priority, from, to, tally time.Duration) paceRun {
	var r paceRun
	for at := from; at < to; at += 100 * time.Microsecond {
		now := thStart.Add(at)
		d := th.Admit(now, prio, "")
		count := at >= tally
		if !d.OK {
			if count && d.HeldBack {
				r.refused++
			}
			continue
		}
		resp := b.serve(now)
		ok := resp.StatusCode == 200
		th.Done(now, policy.Success, ok, resp)
		if count {
			r.sent++
			if ok {
				r.accepted++
			}
		}
	}
	return r
}

// TestPushbackPacesToTheAcceptedRate is the trap at the throttler: a token
// bucket at 200/s answers the excess with 429 and Retry-After: 1, and
// keeps admitting its rate. Stopping BestEffort for a second at each 429
// would waste that rate; the pace keeps the backend's rate (goodput at
// least 0.95 of it, over 1 to 5 s after the first 429, with a bucket of
// 20; 0.88 with a bucket of 1, which refuses a paced attempt a little
// early) for at most 1.15 wire calls per accept, and follows the rate
// down to 100/s and up to 400/s.
func TestPushbackPacesToTheAcceptedRate(t *testing.T) {
	for _, burst := range []float64{1, 20} {
		th := newThrottler(policy.Throttler{}, thStart, 1)
		b := &tokenBucket{rate: 200, burst: burst, tokens: burst}
		steps := []struct {
			rate         float64
			from, to     time.Duration
			tallyFrom    time.Duration
			minGoodput   float64 // of the rate
			maxWirePerOK float64
		}{
			{200, 0, 5 * time.Second, time.Second, 0.95, 1.15},
			{100, 5 * time.Second, 10 * time.Second, 6 * time.Second, 0.95, 1.15},
			{400, 10 * time.Second, 15 * time.Second, 11 * time.Second, 0.95, 1.15},
		}
		if burst == 1 {
			// See TestPushbackPaceAgainstAStrictBucket.
			for i := range steps {
				steps[i].minGoodput = 0.88
			}
		}
		for _, s := range steps {
			b.rate = s.rate
			r := paceDrive(th, b, shedding.BestEffort, s.from, s.to, s.tallyFrom)
			secs := (s.to - s.tallyFrom).Seconds()
			goodput := float64(r.accepted) / secs / s.rate
			wire := float64(r.sent) / float64(max(r.accepted, 1))
			t.Logf("burst %v, %v/s: %.0f accepted/s (%.3f of the rate), %.3f wire calls per accept, %.0f held back/s, pace %.1f/s",
				burst, s.rate, float64(r.accepted)/secs, goodput, wire, float64(r.refused)/secs, th.Hold(thStart.Add(s.to)).Rate)
			if goodput < s.minGoodput {
				t.Errorf("burst %v, %v/s: goodput %.3f of the rate, want >= %v", burst, s.rate, goodput, s.minGoodput)
			}
			if wire > s.maxWirePerOK {
				t.Errorf("burst %v, %v/s: %.3f wire calls per accept, want <= %v", burst, s.rate, wire, s.maxWirePerOK)
			}
		}
	}
}

// TestPushbackPaceFindsAHighRate: a hold begins with sparse attempts, so
// the first rate it measures is below the backend's; while the backend
// refuses none of the paced attempts, the pace doubles the measured rate
// each turn of the ring, and finds 2000/s within the first second.
func TestPushbackPaceFindsAHighRate(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	b := &tokenBucket{rate: 2000, burst: 20, tokens: 20}
	first := paceDrive(th, b, shedding.BestEffort, 0, time.Second, 0)
	then := paceDrive(th, b, shedding.BestEffort, time.Second, 3*time.Second, time.Second)
	t.Logf("first second: %d accepted; next two: %.3f of the rate, %.3f wire calls per accept",
		first.accepted, float64(then.accepted)/2/2000, float64(then.sent)/float64(then.accepted))
	if then.accepted < 2*2000*95/100 || then.sent > then.accepted*110/100 {
		t.Errorf("after the first second: %d sent, %d accepted in 2s; want at least 3800 accepted for at most 1.1 wire calls each", then.sent, then.accepted)
	}
}

// TestPushbackPaceAgainstAStrictBucket measures the pace's weak case, a
// bucket of one token (nginx's limit_req without burst: one request per
// 1/rate exactly), where an attempt a little early is refused and the
// token it missed goes unused until the next attempt. With attempts
// offered every 100µs, the pace keeps about 0.91 of 50/s and 0.93 of
// 200/s, and all of 2000/s, whose interval is only five of those steps.
// (With a headroom of 1.1 rather than 1.05 it keeps 0.83 of 50/s.)
func TestPushbackPaceAgainstAStrictBucket(t *testing.T) {
	for _, tc := range []struct{ rate, minGoodput float64 }{{50, 0.85}, {200, 0.85}, {2000, 0.85}} {
		th := newThrottler(policy.Throttler{}, thStart, 1)
		b := &tokenBucket{rate: tc.rate, burst: 1, tokens: 1}
		r := paceDrive(th, b, shedding.BestEffort, 0, 5*time.Second, time.Second)
		goodput := float64(r.accepted) / 4 / tc.rate
		wire := float64(r.sent) / float64(max(r.accepted, 1))
		t.Logf("%v/s: %.3f of the rate, %.3f wire calls per accept", tc.rate, goodput, wire)
		if goodput < tc.minGoodput || wire > 1.15 {
			t.Errorf("%v/s: goodput %.3f of the rate, %.3f wire calls per accept; want >= %v, <= 1.15", tc.rate, goodput, wire, tc.minGoodput)
		}
	}
}

// TestPushbackPaceAgainstARefusingBackend: a backend that accepts nothing
// and answers every attempt 429 with Retry-After: 1 gets attempts further
// and further apart, a handful a second rather than the 10,000 offered.
func TestPushbackPaceAgainstARefusingBackend(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	b := &tokenBucket{rate: 0, burst: 0}
	r := paceDrive(th, b, shedding.Bulk, 0, 10*time.Second, 0)
	t.Logf("%d sent in 10s, %d held back", r.sent, r.refused)
	if r.accepted != 0 || r.sent > 10*20 {
		t.Errorf("%d sent, %d accepted in 10s, want at most 20 a second", r.sent, r.accepted)
	}
}

// TestPushbackPaceCountsCriticalFirst: Critical attempts count against the
// pace and are never refused by it; when they take the backend's whole
// rate, Bulk gets close to nothing.
func TestPushbackPaceCountsCriticalFirst(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	b := &tokenBucket{rate: 200, burst: 20, tokens: 20}
	var critical, bulk paceRun
	// Critical every 4ms (250/s, above the rate), Bulk every 100µs.
	for at := time.Duration(0); at < 5*time.Second; at += 100 * time.Microsecond {
		now := thStart.Add(at)
		prio, r := shedding.Bulk, &bulk
		if at%(4*time.Millisecond) == 0 {
			prio, r = shedding.Critical, &critical
		}
		d := th.Admit(now, prio, "")
		if !d.OK {
			if prio == shedding.Critical {
				t.Fatalf("Critical refused at %v: %+v", at, d)
			}
			continue
		}
		resp := b.serve(now)
		ok := resp.StatusCode == 200
		th.Done(now, policy.Success, ok, resp)
		if at >= time.Second {
			r.sent++
			if ok {
				r.accepted++
			}
		}
	}
	t.Logf("critical %d sent, %d accepted; bulk %d sent, %d accepted (4s)", critical.sent, critical.accepted, bulk.sent, bulk.accepted)
	if critical.sent != 1000 {
		t.Errorf("Critical sent %d of 1000", critical.sent)
	}
	if bulk.sent > critical.sent/10 {
		t.Errorf("Bulk sent %d beside Critical's %d at the backend's rate, want at most a tenth", bulk.sent, critical.sent)
	}
}

// TestPushbackHoldStartsOver: a hold that lapsed starts over when a 429
// arms a new one, at the first attempt's full bucket; Hold reports the
// pace once it has a rate.
func TestPushbackHoldStartsOver(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	b := &tokenBucket{rate: 200, burst: 1, tokens: 1}
	paceDrive(th, b, shedding.Bulk, 0, 2*time.Second, 0)
	if h := th.Hold(thStart.Add(2 * time.Second)); h.Left <= 0 || h.Stopped || h.Rate < 150 || h.Rate > 500 {
		t.Fatalf("while paced: Hold = %+v, want a pace near 220/s", h)
	}
	// The backend goes quiet for 3s; then it answers 429 at once.
	now := thStart.Add(5 * time.Second)
	if h := th.Hold(now); h != (Hold{}) {
		t.Fatalf("after the hold lapsed: Hold = %+v", h)
	}
	pushedBack(t, th, now, answer(429, "1"))
	if h := th.Hold(now); h.Left != time.Second || h.Rate != 0 {
		t.Errorf("a new hold: Hold = %+v, want 1s left and no rate yet", h)
	}
	if d := th.Admit(now.Add(time.Microsecond), shedding.Bulk, ""); !d.OK {
		t.Errorf("the first Bulk attempt of a new hold: %+v", d)
	}
}

// TestPushbackStopThenPace: a 503 stops Bulk; a 429's pace that outlasts
// it takes over when the stop ends.
func TestPushbackStopThenPace(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	pushedBack(t, th, thStart, answer(429, "3"))
	pushedBack(t, th, thStart, answer(503, "1"))
	if d := th.Admit(thStart.Add(999*time.Millisecond), shedding.Bulk, ""); d.OK || d.RetryAfter != time.Millisecond {
		t.Errorf("during the stop: %+v, want held back for 1ms", d)
	}
	h := th.Hold(thStart.Add(time.Second))
	if h.Stopped || h.Left != 2*time.Second {
		t.Errorf("after the stop: Hold = %+v, want paced for 2s more", h)
	}
	if d := th.Admit(thStart.Add(time.Second), shedding.Bulk, ""); !d.OK {
		t.Errorf("the pace's first Bulk attempt after the stop: %+v", d)
	}
}

// TestPushbackRetryAfterOfAPacedRefusal: a paced refusal says when the
// pace, at its rate then, would let the next attempt through. Callers that
// wait that long each time they are refused, and no longer, get the pace:
// about one attempt per 1/(1.05 × 200) s against a backend at 200/s.
func TestPushbackRetryAfterOfAPacedRefusal(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	b := &tokenBucket{rate: 200, burst: 20, tokens: 20}
	paceDrive(th, b, shedding.Bulk, 0, time.Second, 0)
	// Four callers, each waiting what its refusal said.
	next := []time.Duration{time.Second, time.Second + 10*time.Microsecond, time.Second + 20*time.Microsecond, time.Second + 30*time.Microsecond}
	var run paceRun
	for {
		i := 0
		for j := range next {
			if next[j] < next[i] {
				i = j
			}
		}
		at := next[i]
		if at >= 3*time.Second {
			break
		}
		now := thStart.Add(at)
		d := th.Admit(now, shedding.Bulk, "")
		if !d.OK {
			if !d.HeldBack || d.RetryAfter < time.Millisecond || d.RetryAfter > 50*time.Millisecond {
				t.Fatalf("at %v: a paced refusal with %+v, want a RetryAfter of a few ms", at, d)
			}
			run.refused++
			next[i] += d.RetryAfter
			continue
		}
		resp := b.serve(now)
		th.Done(now, policy.Success, resp.StatusCode == 200, resp)
		run.sent++
		if resp.StatusCode == 200 {
			run.accepted++
		}
		next[i] += time.Millisecond // the caller's next call
	}
	t.Logf("2s: %d sent, %d accepted, %d refusals", run.sent, run.accepted, run.refused)
	if run.accepted < 2*190 || run.sent > run.accepted*115/100 {
		t.Errorf("callers honouring RetryAfter: %d sent, %d accepted in 2s; want about 400 accepted, for at most 1.15 sent each", run.sent, run.accepted)
	}
	// Each refusal asks for the time to the next token: at each token the
	// three callers that do not get it are refused, and the one that did
	// once more when it comes back after its call, four refusals an
	// attempt. A RetryAfter too short would make that many more.
	if run.refused > 5*run.sent {
		t.Errorf("%d refusals for %d attempts sent: RetryAfter is too short to be of use", run.refused, run.sent)
	}
}

// TestPushbackDoesNotAllocate: once a hold has been armed, arming it
// again, pacing and stopping allocate nothing.
func TestPushbackDoesNotAllocate(t *testing.T) {
	th := newThrottler(policy.Throttler{}, thStart, 1)
	stop, pace := answer(503, "1"), answer(429, "1")
	pushedBack(t, th, thStart, pace)
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		now := thStart.Add(time.Duration(i) * 100 * time.Microsecond)
		d := th.Admit(now, allPriorities[i%4], "")
		if d.OK {
			resp := pace
			if i%50 == 0 {
				resp = stop
			}
			th.Done(now, policy.Success, i%3 == 0, resp)
		}
		_ = th.Hold(now)
		i++
	}); n != 0 {
		t.Errorf("Admit, Done and Hold under pushback allocate %v times, want 0", n)
	}
}

// TestPushbackNilThrottler: a nil throttler arms nothing.
func TestPushbackNilThrottler(t *testing.T) {
	var th *Throttler
	if p := th.Done(thStart, policy.Failure, false, answer(503, "1")); p.Armed() {
		t.Errorf("a nil throttler armed %+v", p)
	}
	if h := th.Hold(thStart); h != (Hold{}) {
		t.Errorf("a nil throttler holds %+v", h)
	}
}
