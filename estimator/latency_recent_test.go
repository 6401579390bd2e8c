package estimator

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// calmLatency is a host's calm: 98% of calls near 4ms, 2% at 100ms (the
// tail that hedging is for).
func calmLatency(r *rand.Rand) time.Duration {
	if r.IntN(50) == 0 {
		return 100 * time.Millisecond
	}
	return 3800*time.Microsecond + time.Duration(r.Int64N(int64(400*time.Microsecond)))
}

// brownoutLatency is every call slowed to 35-45ms.
func brownoutLatency(r *rand.Rand) time.Duration {
	return 35*time.Millisecond + time.Duration(r.Int64N(int64(10*time.Millisecond)))
}

// traffic is a host's calls as a window sees them: rate calls a second,
// evenly spaced, each recorded and followed by a Threshold read (as the
// transport reads it for every call), their latency drawn by the phase
// they start in.
type traffic struct {
	w    *LatencyWindow
	rng  *rand.Rand
	rate int

	at      time.Duration // of the next call, since t0
	samples []sample      // every sample recorded, in order
	last    time.Duration // the last warm Threshold
	// marks is, by period, how many samples had been recorded at its
	// first warm read, where Threshold took its mark.
	marks map[uint64]int
}

type sample struct {
	at     time.Duration
	period uint64 // tr.w.clock.epoch(t0.Add(at))
	d      time.Duration
	fast   bool // a failure below the last threshold (see RecordFailure)
}

// point is a Threshold read: when, and what it answered.
type point struct {
	at  time.Duration
	thr time.Duration
	ok  bool
}

func newTraffic(cfg LatencyConfig, rate int, seed uint64) *traffic {
	return &traffic{w: NewLatencyWindow(cfg, t0), rng: rand.New(rand.NewPCG(seed, 26)), rate: rate, marks: map[uint64]int{}}
}

// run drives the calls of [tr.at, until) with latencies from draw, and
// returns the Threshold read after each.
func (tr *traffic) run(until time.Duration, draw func(*rand.Rand) time.Duration) []point {
	return tr.runFailing(until, func(r *rand.Rand) (time.Duration, bool) { return draw(r), false })
}

// runFailing is run for calls some of which fail, as draw says: those are
// recorded with RecordFailure.
func (tr *traffic) runFailing(until time.Duration, draw func(*rand.Rand) (time.Duration, bool)) []point {
	var pts []point
	for ; tr.at < until; tr.at += time.Second / time.Duration(tr.rate) {
		now := t0.Add(tr.at)
		d, failed := draw(tr.rng)
		fast := false
		if failed {
			// The rule RecordFailure documents, from the outside.
			fast = tr.last != 0 && d < tr.last
			tr.w.RecordFailure(now, d)
		} else {
			tr.w.Record(now, d)
		}
		p := tr.w.clock.epoch(now)
		tr.samples = append(tr.samples, sample{tr.at, p, d, fast})
		thr, ok := tr.w.Threshold(now)
		pts = append(pts, point{tr.at, thr, ok})
		if ok {
			tr.last = thr
			if _, marked := tr.marks[p]; !marked {
				tr.marks[p] = len(tr.samples)
			}
		}
	}
	return pts
}

// quantileSince returns the exact sample quantile q of the samples
// recorded at or after from.
func (tr *traffic) quantileSince(from time.Duration, q float64) time.Duration {
	var ds []time.Duration
	for _, s := range tr.samples {
		if s.at >= from {
			ds = append(ds, s.d)
		}
	}
	slices.Sort(ds)
	return exactQuantile(ds, q)
}

// TestLatencyWindowComesDownAfterABrownout: at 200 calls a second, a calm
// of 20s, a brownout of 8s, and the calm again. The threshold rises with
// the brownout, and within 3s of its end it is back near the calm's: at
// most a quarter above the calm's threshold, and never below the calm's
// sample quantile.
func TestLatencyWindowComesDownAfterABrownout(t *testing.T) {
	const (
		rate = 200
		end  = 28 * time.Second // of the brownout
	)
	tr := newTraffic(LatencyConfig{}, rate, 1)
	before := tr.run(20*time.Second, calmLatency)
	calm := before[len(before)-1].thr
	calmExact := tr.quantileSince(0, defaultQuantile)
	if calm < calmExact || calm > up(calmExact) {
		t.Fatalf("calm threshold %v, want the bucket of the calm's p95 %v", calm, calmExact)
	}
	during := tr.run(end, brownoutLatency)
	if last := during[len(during)-1]; last.thr < 35*time.Millisecond {
		t.Fatalf("end of the brownout: threshold %v, want it risen to the brownout's latency", last.thr)
	}
	after := tr.run(end+10*time.Second, calmLatency)
	for _, p := range after {
		if p.at < end+3*time.Second {
			continue
		}
		if p.thr > calm+calm/4 || p.thr < calmExact || !p.ok {
			t.Fatalf("%v after the brownout: threshold %v, %v; want within [%v, %v] (the calm's p95 and its threshold + 25%%)",
				p.at-end, p.thr, p.ok, calmExact, calm+calm/4)
		}
	}
	down := slices.IndexFunc(after, func(p point) bool { return p.thr <= calm+calm/4 })
	t.Logf("calm threshold %v; brownout %v; back to %v at %v after the brownout",
		calm, during[len(during)-1].thr, after[down].thr, after[down].at-end)
}

// TestLatencyWindowRisesBeforeTheWindowDoes: at 200 calls a second, a
// calm of 20s and then a brownout. The window's own p95 takes over a
// second to reach the brownout's latency (a twentieth of the 22.5-30s it
// holds), and the recent samples raise the answer before it: within 40
// calls of the brownout's start (0.2s), once a twentieth of the samples
// since the mark of the period before (and one standard deviation more)
// are slower than the calm's p95. No answer after that is below the
// window's.
func TestLatencyWindowRisesBeforeTheWindowDoes(t *testing.T) {
	const start = 20 * time.Second // of the brownout
	tr := newTraffic(LatencyConfig{}, 200, 2)
	tr.run(start, calmLatency)
	pts := tr.run(start+8*time.Second, brownoutLatency)
	risen := slices.IndexFunc(pts, func(p point) bool { return p.thr >= 35*time.Millisecond })
	window := slices.IndexFunc(pts, func(p point) bool { w, _ := tr.windowAt(p.at, defaultQuantile); return w >= 35*time.Millisecond })
	if risen < 0 || window < 0 {
		t.Fatalf("the threshold (%d) or the window (%d) never reached the brownout's 35ms", risen, window)
	}
	t.Logf("risen to %v at %v into the brownout (call %d); the window's p95 at %v", pts[risen].thr, pts[risen].at-start, risen+1, pts[window].at-start)
	if risen >= 40 {
		t.Errorf("the threshold reached the brownout's 35ms at its call %d, want within 40", risen+1)
	}
	for _, p := range pts[risen:] {
		if w, _ := tr.windowAt(p.at, defaultQuantile); p.thr < w {
			t.Fatalf("at %v into the brownout: threshold %v, below the window's %v", p.at-start, p.thr, w)
		}
	}
}

// sameAsTheWindow checks that every read of pts answered what the window
// alone would have: its quantile, scanned at the first read of a period
// that found it warm and memoized for the rest of the period, and scanned
// at every read while it is cold.
func (tr *traffic) sameAsTheWindow(t *testing.T, pts []point) {
	t.Helper()
	period := uint64(math.MaxUint64)
	var want time.Duration
	memoized := false
	for _, p := range pts {
		if e := tr.w.clock.epoch(t0.Add(p.at)); e != period {
			period, memoized = e, false
		}
		if !memoized {
			var n uint64
			want, n = tr.windowAt(p.at, defaultQuantile)
			memoized = n >= tr.w.minimum
		}
		if p.thr != want {
			t.Fatalf("at %v: threshold %v, want the window's %v", p.at, p.thr, want)
		}
	}
}

// windowAt returns what the window alone answers for q at at, from the
// samples recorded until then, and how many it holds.
func (tr *traffic) windowAt(at time.Duration, q float64) (time.Duration, uint64) {
	var sum [numBuckets]uint64
	var n uint64
	for _, s := range tr.held(at, rings<<periodShift) {
		if s.period>>periodShift+rings > tr.w.clock.epoch(t0.Add(at))>>periodShift {
			sum[bucketIndex(s.d)]++
			n++
		}
	}
	return bucketUpper(quantileBucket(sum[:], n, q)), n
}

// held returns the samples recorded until at in the last periods periods
// (the one at is in included), in order.
func (tr *traffic) held(at time.Duration, periods uint64) []sample {
	p := tr.w.clock.epoch(t0.Add(at))
	from := uint64(0)
	if p >= periods {
		from = p - periods + 1
	}
	lo, _ := slices.BinarySearchFunc(tr.samples, from, func(s sample, p uint64) int { return cmp.Compare(s.period, p) })
	hi, _ := slices.BinarySearchFunc(tr.samples, at+1, func(s sample, at time.Duration) int { return cmp.Compare(s.at, at) })
	return tr.samples[lo:max(lo, hi)]
}

// TestLatencyWindowQuietHostAsTheWindow: on a host too quiet to fill the
// recent samples (50 calls a second, at most 141 samples in three periods,
// short of the 200 the p95 needs), every answer is the window's alone,
// through a brownout and after it.
func TestLatencyWindowQuietHostAsTheWindow(t *testing.T) {
	tr := newTraffic(LatencyConfig{}, 50, 3)
	var pts []point
	pts = append(pts, tr.run(20*time.Second, calmLatency)...)
	pts = append(pts, tr.run(28*time.Second, brownoutLatency)...)
	pts = append(pts, tr.run(60*time.Second, calmLatency)...)
	tr.sameAsTheWindow(t, pts)
	// And the window alone stays up until it forgets the brownout.
	if p := pts[slices.IndexFunc(pts, func(p point) bool { return p.at >= 40*time.Second })]; p.thr < 35*time.Millisecond {
		t.Fatalf("12s after the brownout: threshold %v, want the window's, still up", p.thr)
	}
}

// TestLatencyWindowNeverBelowItsData checks Threshold over random traffic
// (phases of 0.3 to 5s, 20 to 1500 calls a second, medians from 2µs to
// 200ms, some phases failing fast): at the first read of every period, the
// answer is the window's, or, when there are enough recent samples, the
// bucket of their upper bound if it is lower (never below the sample
// quantile of the samples it is taken from), or the bucket of their lower
// bound if it is higher (never above their sample quantile's bucket).
func TestLatencyWindowNeverBelowItsData(t *testing.T) {
	rates := []int{20, 80, 200, 600, 1500}
	medians := []time.Duration{2 * time.Microsecond, 300 * time.Microsecond, 4 * time.Millisecond, 40 * time.Millisecond, 200 * time.Millisecond}
	lowered, raised, withFast := 0, 0, 0
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 7))
		tr := newTraffic(LatencyConfig{}, 200, seed)
		var pts []point
		for tr.at < 60*time.Second {
			tr.rate = rates[rng.IntN(len(rates))]
			median := medians[rng.IntN(len(medians))]
			sigma := rng.Float64()
			failing := []float64{0, 0, 0.1, 0.5, 1}[rng.IntN(5)]
			until := tr.at + time.Duration(300+rng.IntN(4700))*time.Millisecond
			pts = append(pts, tr.runFailing(until, func(r *rand.Rand) (time.Duration, bool) {
				if r.Float64() < failing {
					return median / 20, true
				}
				return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64())), false
			})...)
		}
		period := uint64(math.MaxUint64)
		for _, p := range pts {
			e := tr.w.clock.epoch(t0.Add(p.at))
			if e == period || !p.ok {
				continue
			}
			period = e
			window, _ := tr.windowAt(p.at, defaultQuantile)
			if p.thr == window {
				exact := tr.exactAt(p.at)
				if p.thr < exact || p.thr > up(exact) {
					t.Fatalf("seed %d, at %v: threshold %v, the window's; want the bucket of its sample p95 %v", seed, p.at, p.thr, exact)
				}
				continue
			}
			rankOf, recent := upperRankOf, tr.recentAt(p.at, 2, 1)
			if p.thr > window {
				// The rise reads the samples since the mark of the period
				// before, if there are enough.
				raised++
				rankOf, recent = lowerRankOf, tr.recentAt(p.at, 1)
				if !tr.enough(recent) {
					recent = tr.recentAt(p.at, 2, 1)
				}
			} else {
				lowered++
			}
			var ds []time.Duration
			var others []time.Duration // but the fast failures
			for _, s := range recent {
				ds = append(ds, s.d)
				if !s.fast {
					others = append(others, s.d)
				}
			}
			slices.Sort(ds)
			slices.Sort(others)
			k, f := uint64(len(ds)), uint64(len(ds)-len(others))
			var want, exact time.Duration
			if k-f > 0 {
				want = bucketUpper(bucketIndex(ds[rankOf(defaultQuantile, k-f)+f-1]) | 1)
				exact = exactQuantile(others, defaultQuantile)
			}
			if k-f < tr.w.recentMinimum || p.thr != want || p.thr < window && p.thr < exact || p.thr > window && p.thr > bucketUpper(bucketIndex(exact)|1) {
				t.Fatalf("seed %d, at %v: threshold %v, window %v, %d recent samples, %d fast failures (sample p95 of the others %v); want the window's, or the recent samples' %v, from at least %d",
					seed, p.at, p.thr, window, k, f, exact, want, tr.w.recentMinimum)
			}
			if f > 0 {
				withFast++
			}
		}
	}
	if lowered == 0 || raised == 0 || withFast == 0 {
		t.Fatalf("%d answers lowered and %d raised by the recent samples, %d with fast failures: the test tests too little of them", lowered, raised, withFast)
	}
	t.Logf("%d period answers lowered and %d raised by the recent samples, %d with fast failures among them", lowered, raised, withFast)
}

// recentAt returns the recent samples at at: those recorded since the
// mark of backs[0] periods before or, missing that, of backs[1] and so on.
func (tr *traffic) recentAt(at time.Duration, backs ...uint64) []sample {
	p := tr.w.clock.epoch(t0.Add(at))
	hi, _ := slices.BinarySearchFunc(tr.samples, at+1, func(s sample, at time.Duration) int { return cmp.Compare(s.at, at) })
	for _, back := range backs {
		if m, ok := tr.marks[p-back]; ok && p >= back {
			return tr.samples[m:hi]
		}
	}
	return nil
}

// enough reports whether samples, but their fast failures, are enough
// for an answer from the recent samples.
func (tr *traffic) enough(samples []sample) bool {
	n := uint64(0)
	for _, s := range samples {
		if !s.fast {
			n++
		}
	}
	return n >= tr.w.recentMinimum
}

// exactAt returns the exact sample p95 at at of the window's samples.
func (tr *traffic) exactAt(at time.Duration) time.Duration {
	e := tr.w.clock.epoch(t0.Add(at)) >> periodShift
	var ds []time.Duration
	for _, s := range tr.held(at, rings<<periodShift) {
		if s.period>>periodShift+rings > e {
			ds = append(ds, s.d)
		}
	}
	slices.Sort(ds)
	return exactQuantile(ds, defaultQuantile)
}

// TestLatencyWindowFastFailuresDoNotPullItDown: at 200 calls a second, a
// host whose every call fails at once (0.2ms) for 4s, and then calm again.
// Recorded as failures, they leave the recent samples' quantile alone, and the
// threshold holds at the calm's; recorded as answers (with Record), they
// would have pulled it down to their speed.
func TestLatencyWindowFastFailuresDoNotPullItDown(t *testing.T) {
	fast := func(*rand.Rand) (time.Duration, bool) { return 200 * time.Microsecond, true }
	for _, asFailures := range []bool{true, false} {
		tr := newTraffic(LatencyConfig{}, 200, 5)
		pts := tr.run(20*time.Second, calmLatency)
		calm := pts[len(pts)-1].thr
		if asFailures {
			pts = tr.runFailing(24*time.Second, fast)
		} else {
			pts = tr.run(24*time.Second, func(r *rand.Rand) time.Duration { d, _ := fast(r); return d })
		}
		pts = append(pts, tr.run(28*time.Second, calmLatency)...)
		low := slices.MinFunc(pts, func(a, b point) int { return cmp.Compare(a.thr, b.thr) })
		switch {
		case asFailures && low.thr != calm:
			t.Errorf("fast failures: threshold down to %v at %v, want it held at the calm's %v", low.thr, low.at, calm)
		case !asFailures && low.thr > time.Millisecond:
			t.Errorf("fast answers (Record): threshold at least %v, want it pulled below 1ms", low.thr)
		}
	}
}

func TestLatencyWindowRecentMinimum(t *testing.T) {
	for _, c := range []struct {
		cfg  LatencyConfig
		want uint64
	}{
		{LatencyConfig{}, 200},
		{LatencyConfig{Quantile: 0.99}, 1000},
		{LatencyConfig{Quantile: 0.5}, 20},                 // MinSamples, above 10/(1-q)
		{LatencyConfig{Quantile: 0.5, MinSamples: -1}, 20}, // 10/(1-q)
		{LatencyConfig{Quantile: 0.9, MinSamples: 500}, 500},
		{LatencyConfig{Quantile: -1, MinSamples: -1}, 10},
		{LatencyConfig{Quantile: 1}, math.MaxUint64},
		{LatencyConfig{Quantile: 2}, math.MaxUint64},
	} {
		if got := NewLatencyWindow(c.cfg, t0).recentMinimum; got != c.want {
			t.Errorf("%+v: the recent samples need to be %d, want %d", c.cfg, got, c.want)
		}
	}
}

// TestLatencyWindowConcurrentMarks races writers and readers across
// periods and slices, the clock stepping 10ms at a time, 300 calls a
// second: 20s at 40ms, then 20s at 3.8ms. The marks are taken by whichever
// reader comes first and read only whole, so every warm answer is one of
// the two latencies' bounds, the window's or the recent samples' (coarse).
// A reader descheduled between claiming a mark and copying it (a busy
// machine, the race detector) copies it late, and the recent samples it
// describes are then off until the next marks: so the end is checked
// after two more periods of one caller, when, with the window still
// holding 40ms calls, the answer is the recent samples' 3.8ms.
func TestLatencyWindowConcurrentMarks(t *testing.T) {
	const slow, fast = 40 * time.Millisecond, 3800 * time.Microsecond
	coarse := func(d time.Duration) time.Duration { return bucketUpper(bucketIndex(d) | 1) }
	valid := []time.Duration{up(slow), coarse(slow), up(fast), coarse(fast)}
	w := NewLatencyWindow(LatencyConfig{}, t0)
	at := func(k int64) time.Time { return t0.Add(time.Duration(k) * 10 * time.Millisecond) }
	var tick atomic.Int64
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				k := tick.Add(1)
				if k > 4000 {
					return
				}
				d := slow
				if k > 2000 {
					d = fast
				}
				for range 3 {
					w.Record(at(k), d)
				}
				// Every caller reads, as the transport's do: the marks
				// are taken by the reads.
				if thr, ok := w.Threshold(at(k)); ok && !slices.Contains(valid, thr) {
					t.Errorf("at %v: threshold %v, want one of %v", at(k).Sub(t0), thr, valid)
					return
				}
			}
		})
	}
	wg.Wait()
	const end = 4000 + 200 // two periods (Window/32 each) more
	for k := int64(4001); k <= end; k++ {
		for range 3 {
			w.Record(at(k), fast)
		}
		w.Threshold(at(k))
	}
	if thr, _ := w.Threshold(at(end + 1)); thr != coarse(fast) {
		t.Errorf("after 22s at %v: threshold %v, want the recent samples' %v (the window's is %v)",
			fast, thr, coarse(fast), first(w.Quantile(at(end+1), defaultQuantile)))
	}
}

func first(d time.Duration, _ bool) time.Duration { return d }

// TestLatencyWindowSteadyIsNotLowered: on a steady bimodal host (97% of
// calls near 4.75ms, 3% at 150ms, 250 calls a second), the recent samples
// and the window estimate the same p95, which lies near a bucket edge of
// the recent samples. The lower of the two would be biased low: taken
// whenever the recent samples' estimate fell below by chance, it hedges
// more calls than the window's own answer; the higher, biased high, fewer.
// An answer from the recent samples must be below the window's, or above
// it, by more than their noise, so that on steady traffic at most a tenth
// of the period answers are lowered and at most a tenth raised, and the
// share of calls slower than the answer read before them is within 5% of
// the share slower than the window's own answer (4 seeds, 60s each).
func TestLatencyWindowSteadyIsNotLowered(t *testing.T) {
	var above, windowAbove, calls, lowered, raised, periods int
	for seed := range uint64(4) {
		w := NewLatencyWindow(LatencyConfig{}, t0)
		rng := rand.New(rand.NewPCG(seed, 9))
		var thr, window time.Duration
		period := uint64(0)
		for at := time.Duration(0); at < 80*time.Second; at += time.Second / 250 {
			now := t0.Add(at)
			d := time.Duration(4750 * float64(time.Microsecond) * math.Exp(0.05*rng.NormFloat64()))
			if rng.IntN(100) < 3 {
				d = 150 * time.Millisecond
			}
			counted := at >= 20*time.Second // the window full
			if counted {
				calls++
				if d > thr {
					above++
				}
				if d > window {
					windowAbove++
				}
			}
			w.Record(now, d)
			thr, _ = w.Threshold(now)
			if p := w.clock.epoch(now); p != period {
				// The window's own answer, memoized for the period as
				// Threshold's is.
				period = p
				window, _ = w.Quantile(now, defaultQuantile)
				if counted {
					periods++
					if thr < window {
						lowered++
					}
					if thr > window {
						raised++
					}
				}
			}
		}
	}
	share, windowShare := float64(above)/float64(calls), float64(windowAbove)/float64(calls)
	t.Logf("%d of %d period answers lowered, %d raised; %.2f%% of calls slower than the answer, %.2f%% than the window's", lowered, periods, raised, 100*share, 100*windowShare)
	if lowered*10 > periods {
		t.Errorf("%d of %d period answers below the window's on steady traffic, want at most a tenth", lowered, periods)
	}
	if raised*10 > periods {
		t.Errorf("%d of %d period answers above the window's on steady traffic, want at most a tenth", raised, periods)
	}
	if share > 1.05*windowShare || share < 0.95*windowShare {
		t.Errorf("%.2f%% of calls slower than the answer, want within 5%% of the window's own %.2f%%", 100*share, 100*windowShare)
	}
}

// TestLatencyWindowRiseEndsALoweredAnswer: at 250 calls a second, latency
// 1ms for 3s and then 4ms for 1s, over and over. The window, a quarter of
// whose samples take 4ms, answers the 4ms bucket; the recent samples
// answer 1ms in the long phase. When the latency steps up, the records
// above the 1ms answer end it within a few dozen calls, instead of its period's
// end: at most 1.5 × (1 − q) of the calls are slower than the answer read
// before them (counted from 12s, the window full), and every call from
// the 40th of a 4ms phase on reads an answer of at least 4ms.
func TestLatencyWindowRiseEndsALoweredAnswer(t *testing.T) {
	const cycle = 4 * time.Second
	phased := func(at time.Duration) func(*rand.Rand) time.Duration {
		if at%cycle < 3*time.Second {
			return func(*rand.Rand) time.Duration { return time.Millisecond }
		}
		return func(*rand.Rand) time.Duration { return 4 * time.Millisecond }
	}
	tr := newTraffic(LatencyConfig{}, 250, 11)
	var pts []point
	for at := time.Duration(0); at < 60*time.Second; at += time.Second {
		pts = append(pts, tr.run(at+time.Second, phased(at))...)
	}
	above, calls, lowered := 0, 0, 0
	for i := 1; i < len(pts); i++ {
		at, d := pts[i].at, tr.samples[i].d
		if at < 12*time.Second {
			continue
		}
		calls++
		if d > pts[i-1].thr {
			above++
		}
		if pts[i-1].thr < time.Millisecond*3/2 {
			lowered++
		}
		if into := at % cycle; into >= 3*time.Second+40*time.Second/250 && pts[i-1].thr < 4*time.Millisecond {
			t.Fatalf("at %v, %v into a 4ms phase: threshold %v, want at least 4ms", at, into-3*time.Second, pts[i-1].thr)
		}
	}
	share := float64(above) / float64(calls)
	t.Logf("%.2f%% of calls slower than the answer read before them; the answer lowered to 1ms for %d of %d calls", 100*share, lowered, calls)
	if lowered == 0 {
		t.Fatal("the answer was never lowered: the test tests nothing")
	}
	if share > 1.5*(1-defaultQuantile) {
		t.Errorf("%.2f%% of calls slower than the answer read before them, want at most %.1f%%", 100*share, 150*(1-defaultQuantile))
	}
}

// TestLatencyWindowConcurrentRise races writers and readers as
// TestLatencyWindowConcurrentMarks does, 300 calls a second: 20s at 40ms,
// 20s at 3.8ms, which the recent samples lower the threshold to, then
// 40ms again for 0.3s, within the period that began at 39.375s. Whichever
// writer counts the last record above the lowered answer ends it, every
// warm answer is one of the two latencies' bounds, and 0.3s into the rise
// the answer is at least 40ms.
func TestLatencyWindowConcurrentRise(t *testing.T) {
	const slow, fast = 40 * time.Millisecond, 3800 * time.Microsecond
	coarse := func(d time.Duration) time.Duration { return bucketUpper(bucketIndex(d) | 1) }
	valid := []time.Duration{up(slow), coarse(slow), up(fast), coarse(fast)}
	w := NewLatencyWindow(LatencyConfig{}, t0)
	at := func(k int64) time.Time { return t0.Add(time.Duration(k) * 10 * time.Millisecond) }
	var (
		tick    atomic.Int64
		lowered atomic.Bool // a read in the last 5s at 3.8ms answered below 40ms
		wg      sync.WaitGroup
	)
	for range 6 {
		wg.Go(func() {
			for {
				k := tick.Add(1)
				if k > 4030 {
					return
				}
				d := slow
				if k > 2000 && k <= 4000 {
					d = fast
				}
				for range 3 {
					w.Record(at(k), d)
				}
				thr, ok := w.Threshold(at(k))
				if ok && !slices.Contains(valid, thr) {
					t.Errorf("at %v: threshold %v, want one of %v", at(k).Sub(t0), thr, valid)
					return
				}
				if k > 3500 && k <= 4000 && thr < slow {
					lowered.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if !lowered.Load() {
		t.Fatalf("the recent samples never lowered the threshold: the test tests nothing")
	}
	if thr, _ := w.Threshold(at(4030)); thr < slow {
		t.Errorf("0.3s into the rise to %v: threshold %v, want at least %v", slow, thr, slow)
	}
}

// TestLatencyWindowFollowsARise: at 250 calls a second, a latency that
// rises by 1ms a second from 5ms (a ramp), and one that rises by a quarter
// every 2s from 1ms (a staircase). The window's p95 is the latency of a
// second or more before (a twentieth of the 22.5-30s it holds), below
// every call's; the recent samples must raise the answer, so that at most
// 1.5 × (1 − q) of the calls are slower than the answer read before them
// (counted from 12s to 52s).
func TestLatencyWindowFollowsARise(t *testing.T) {
	for _, c := range []struct {
		name    string
		latency func(at time.Duration) time.Duration
	}{
		{"ramp", func(at time.Duration) time.Duration { return 5*time.Millisecond + at/1000 }},
		{"staircase", func(at time.Duration) time.Duration {
			return time.Duration(float64(time.Millisecond) * math.Pow(1.25, float64(at/(2*time.Second))))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := newTraffic(LatencyConfig{}, 250, 12)
			var pts []point
			for tr.at < 52*time.Second {
				d := c.latency(tr.at)
				pts = append(pts, tr.run(tr.at+1, func(*rand.Rand) time.Duration { return d })...)
			}
			above, calls := 0, 0
			for i := 1; i < len(pts); i++ {
				if pts[i].at < 12*time.Second {
					continue
				}
				calls++
				if tr.samples[i].d > pts[i-1].thr {
					above++
				}
			}
			share := float64(above) / float64(calls)
			t.Logf("%.2f%% of calls slower than the answer read before them", 100*share)
			if share > 1.5*(1-defaultQuantile) {
				t.Errorf("%.2f%% of calls slower than the answer read before them, want at most %.1f%%", 100*share, 150*(1-defaultQuantile))
			}
		})
	}
}
