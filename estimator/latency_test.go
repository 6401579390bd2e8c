package estimator

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// up is what a window reports for a quantile that falls on d.
func up(d time.Duration) time.Duration { return bucketUpper(bucketIndex(d)) }

// exactQuantile is the sample quantile the window bounds: the smallest
// sample s such that at least ceil(q·n) samples are ≤ s.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func TestLatencyWindowAccuracy(t *testing.T) {
	dists := []struct {
		name string
		draw func(*rand.Rand) time.Duration
	}{
		{"constant", func(*rand.Rand) time.Duration { return 37 * time.Millisecond }},
		{"constant-linear", func(*rand.Rand) time.Duration { return 3 * time.Microsecond }},
		{"uniform", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(2 * time.Second))) }},
		{"uniform-small", func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(100 * time.Microsecond))) }},
		{"lognormal", func(r *rand.Rand) time.Duration {
			return time.Duration(math.Exp(math.Log(float64(50*time.Millisecond)) + 1.5*r.NormFloat64()))
		}},
		{"bimodal", func(r *rand.Rand) time.Duration {
			if r.IntN(10) == 0 {
				return time.Duration(float64(800*time.Millisecond) + float64(100*time.Millisecond)*r.NormFloat64())
			}
			return time.Duration(float64(5*time.Millisecond) + float64(time.Millisecond)*r.NormFloat64())
		}},
	}
	quantiles := []float64{0.5, 0.9, 0.95, 0.99}
	for _, dist := range dists {
		t.Run(dist.name, func(t *testing.T) {
			for seed := range uint64(5) {
				rng := rand.New(rand.NewPCG(seed, 42))
				for _, n := range []int{1, 2, 7, 20, 101, 1000, 20000} {
					w := NewLatencyWindow(LatencyConfig{MinSamples: -1}, t0)
					samples := make([]time.Duration, n)
					for i := range samples {
						d := min(max(dist.draw(rng), 0), MaxDuration-1)
						samples[i] = d
						w.Record(t0, d)
					}
					slices.Sort(samples)
					for _, q := range quantiles {
						exact := exactQuantile(samples, q)
						got, ok := w.Quantile(t0, q)
						if !ok {
							t.Fatalf("seed %d, n %d, q %v: not enough samples", seed, n, q)
						}
						limit := exact + exact/8
						if exact < linearNanos {
							limit = exact + 1<<unitShift
						}
						if got < exact || got > limit {
							t.Errorf("seed %d, n %d, q %v: got %v, want in [%v, %v]", seed, n, q, got, exact, limit)
						}
					}
					// The memoized answer is the same kind of bound.
					thr, ok := w.Threshold(t0)
					if want, _ := w.Quantile(t0, defaultQuantile); !ok || thr != want {
						t.Errorf("seed %d, n %d: Threshold = %v, %v; want %v, true", seed, n, thr, ok, want)
					}
					if w.Clamped() != 0 {
						t.Errorf("seed %d, n %d: Clamped = %d, want 0", seed, n, w.Clamped())
					}
				}
			}
		})
	}
}

// latencyStep is one step of a table-driven LatencyWindow test: at t after
// the origin, record d times times, then expect the count and the
// configured quantile (and, if fresh is set, a fresh scan of it).
type latencyStep struct {
	at    time.Duration
	d     time.Duration
	times int

	count uint64
	thr   time.Duration
	ok    bool
	fresh time.Duration
}

func runLatencySteps(t *testing.T, cfg LatencyConfig, steps []latencyStep) {
	t.Helper()
	w := NewLatencyWindow(cfg, t0)
	for i, s := range steps {
		now := t0.Add(s.at)
		for range s.times {
			w.Record(now, s.d)
		}
		if got := w.Count(now); got != s.count {
			t.Errorf("step %d (at %v): Count = %d, want %d", i, s.at, got, s.count)
		}
		if thr, ok := w.Threshold(now); thr != s.thr || ok != s.ok {
			t.Errorf("step %d (at %v): Threshold = %v, %v; want %v, %v", i, s.at, thr, ok, s.thr, s.ok)
		}
		if s.fresh != 0 {
			if got, _ := w.Quantile(now, cfg.Quantile); got != s.fresh {
				t.Errorf("step %d (at %v): Quantile = %v, want %v", i, s.at, got, s.fresh)
			}
		}
	}
}

var (
	ms1   = time.Millisecond
	ms10  = 10 * time.Millisecond
	ms100 = 100 * time.Millisecond
)

func TestLatencyWindowRotation(t *testing.T) {
	// A 4s window: slices of 1s.
	cfg := LatencyConfig{Window: 4 * time.Second, Quantile: 0.5, MinSamples: 3}
	runLatencySteps(t, cfg, []latencyStep{
		{at: 0, d: ms1, times: 3, count: 3, thr: up(ms1), ok: true},
		{at: 1 * time.Second, d: ms10, times: 1, count: 4, thr: up(ms1), ok: true},
		{at: 2500 * time.Millisecond, d: ms10, times: 2, count: 6, thr: up(ms1), ok: true},
		{at: 4*time.Second - 1, count: 6, thr: up(ms1), ok: true},
		// Epoch 4: the ring of epoch 0 is out of the window, uncleared.
		{at: 4 * time.Second, count: 3, thr: up(ms10), ok: true},
		// Recording claims and clears it.
		{at: 4 * time.Second, d: ms100, times: 1, count: 4, thr: up(ms10), ok: true},
		{at: 5 * time.Second, count: 3, thr: up(ms10), ok: true},
		// Below the minimum: the estimate so far, not evidence.
		{at: 6 * time.Second, count: 1, thr: up(ms100), ok: false},
		{at: 7*time.Second + 999*time.Millisecond, count: 1, thr: up(ms100), ok: false},
		{at: 8 * time.Second, count: 0, thr: 0, ok: false},
	})
}

func TestLatencyWindowIdleExpiry(t *testing.T) {
	cfg := LatencyConfig{Window: 4 * time.Second, Quantile: 0.5, MinSamples: 1}
	runLatencySteps(t, cfg, []latencyStep{
		{at: 0, d: ms1, times: 5, count: 5, thr: up(ms1), ok: true},
		{at: 1500 * time.Millisecond, d: ms10, times: 5, count: 10, thr: up(ms1), ok: true},
		{at: 3 * time.Second, count: 10, thr: up(ms1), ok: true},
		{at: 4 * time.Second, count: 5, thr: up(ms10), ok: true},
		// An idle window reports nothing once every ring is stale.
		{at: 5 * time.Second, count: 0, thr: 0, ok: false},
		{at: time.Hour, count: 0, thr: 0, ok: false},
		// A later revolution lands on the ring of epoch 0 (16 ≡ 0 mod 4),
		// and of epoch 1 (4 * 1e6 + 1): no leftovers.
		{at: 16 * time.Second, count: 0, thr: 0, ok: false},
		{at: 16 * time.Second, d: ms100, times: 1, count: 1, thr: up(ms100), ok: true},
		{at: 17 * time.Second, count: 1, thr: up(ms100), ok: true},
		{at: 4_000_001 * time.Second, d: ms10, times: 2, count: 2, thr: up(ms10), ok: true},
	})
}

func TestLatencyWindowMemo(t *testing.T) {
	cfg := LatencyConfig{Window: 4 * time.Second, Quantile: 0.5, MinSamples: 3}
	runLatencySteps(t, cfg, []latencyStep{
		{at: 0, d: ms1, times: 3, count: 3, thr: up(ms1), ok: true, fresh: up(ms1)},
		// The answer is memoized for the rest of the memo period, an
		// eighth of the 1s slice...
		{at: 50 * time.Millisecond, d: ms10, times: 10, count: 13, thr: up(ms1), ok: true, fresh: up(ms10)},
		{at: 125*time.Millisecond - 1, count: 13, thr: up(ms1), ok: true, fresh: up(ms10)},
		// ...and refreshed in the next one.
		{at: 125 * time.Millisecond, count: 13, thr: up(ms10), ok: true, fresh: up(ms10)},
		{at: 1500 * time.Millisecond, count: 13, thr: up(ms10), ok: true, fresh: up(ms10)},
		{at: 1510 * time.Millisecond, d: ms100, times: 30, count: 43, thr: up(ms10), ok: true, fresh: up(ms100)},
		{at: 1625 * time.Millisecond, count: 43, thr: up(ms100), ok: true, fresh: up(ms100)},
	})
}

func TestLatencyWindowColdRecomputes(t *testing.T) {
	// Below MinSamples nothing is memoized: the window turns warm
	// within the slice, as soon as it has enough samples.
	cfg := LatencyConfig{Window: 4 * time.Second, Quantile: 0.5, MinSamples: 5}
	runLatencySteps(t, cfg, []latencyStep{
		{at: 0, count: 0, thr: 0, ok: false},
		{at: 0, d: ms10, times: 1, count: 1, thr: up(ms10), ok: false},
		{at: 100 * time.Millisecond, d: ms1, times: 3, count: 4, thr: up(ms1), ok: false},
		{at: 200 * time.Millisecond, d: ms1, times: 1, count: 5, thr: up(ms1), ok: true},
		// Warm now, and memoized.
		{at: 240 * time.Millisecond, d: ms100, times: 10, count: 15, thr: up(ms1), ok: true, fresh: up(ms100)},
	})
}

func TestLatencyWindowDefaults(t *testing.T) {
	w := NewLatencyWindow(LatencyConfig{}, t0)
	if w.clock.slice<<periodShift != uint64(30*time.Second/4) || w.quantile != 0.95 || w.minimum != 20 {
		t.Errorf("defaults: slice %v, quantile %v, minimum %v; want 7.5s, 0.95, 20",
			time.Duration(w.clock.slice<<periodShift), w.quantile, w.minimum)
	}
	for range 19 {
		w.Record(t0, ms1)
	}
	if _, ok := w.Threshold(t0); ok {
		t.Errorf("19 samples: Threshold ok, want not enough")
	}
	w.Record(t0, ms1)
	if d, ok := w.Threshold(t0); !ok || d != up(ms1) {
		t.Errorf("20 samples: Threshold = %v, %v; want %v, true", d, ok, up(ms1))
	}
	// Samples stay for the whole 30s window less at most one slice.
	if n := w.Count(t0.Add(29 * time.Second)); n != 20 {
		t.Errorf("Count after 29s = %d, want 20", n)
	}
	if n := w.Count(t0.Add(30 * time.Second)); n != 0 {
		t.Errorf("Count after 30s = %d, want 0", n)
	}
}

func TestLatencyWindowClamp(t *testing.T) {
	w := NewLatencyWindow(LatencyConfig{Quantile: 0.5, MinSamples: 1}, t0)
	w.Record(t0, 0)
	w.Record(t0, -time.Second)
	w.Record(t0, time.Duration(math.MinInt64))
	if got := w.Clamped(); got != 2 {
		t.Errorf("Clamped after 0 and two negatives = %d, want 2", got)
	}
	if d, _ := w.Quantile(t0, 1); d != up(0) {
		t.Errorf("max of 0 and negatives = %v, want %v", d, up(0))
	}
	w.Record(t0, MaxDuration-1)
	w.Record(t0, MaxDuration)
	w.Record(t0, time.Hour)
	w.Record(t0, math.MaxInt64)
	if got := w.Clamped(); got != 5 {
		t.Errorf("Clamped = %d, want 5", got)
	}
	if d, _ := w.Quantile(t0, 0.99); d != MaxDuration {
		t.Errorf("p99 = %v, want MaxDuration %v", d, MaxDuration)
	}
	if n := w.Count(t0); n != 7 {
		t.Errorf("Count = %d, want 7", n)
	}
}

func TestLatencyWindowQuantileEdges(t *testing.T) {
	w := NewLatencyWindow(LatencyConfig{MinSamples: 1}, t0)
	if d, ok := w.Quantile(t0, 0.5); d != 0 || ok {
		t.Errorf("empty: Quantile = %v, %v; want 0, false", d, ok)
	}
	for _, d := range []time.Duration{ms1, ms10, ms100} {
		w.Record(t0, d)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{
		{-1, up(ms1)}, {0, up(ms1)}, {math.NaN(), up(ms1)}, {0.33, up(ms1)}, {1.0 / 3, up(ms1)},
		{0.34, up(ms10)}, {2.0 / 3, up(ms10)}, {0.67, up(ms100)}, {1, up(ms100)}, {2, up(ms100)},
	} {
		if got, ok := w.Quantile(t0, c.q); got != c.want || !ok {
			t.Errorf("Quantile(%v) = %v, %v; want %v, true", c.q, got, ok, c.want)
		}
	}
}

func TestLatencyWindowBeforeOrigin(t *testing.T) {
	w := NewLatencyWindow(LatencyConfig{Window: 4 * time.Second, MinSamples: 1}, t0)
	w.Record(t0.Add(-time.Hour), ms1)
	w.Record(time.Time{}, ms1)
	if n := w.Count(t0); n != 2 {
		t.Errorf("Count = %d, want 2 (before the origin counts as epoch 0)", n)
	}
	if n := w.Count(t0.Add(-time.Minute)); n != 2 {
		t.Errorf("Count before the origin = %d, want 2", n)
	}
	// A now far behind the ring's epoch neither panics nor resurrects
	// anything: the sample joins the newer ring.
	w.Record(t0.Add(4*time.Second), ms10)
	w.Record(t0, ms100)
	if n := w.Count(t0.Add(4 * time.Second)); n != 2 {
		t.Errorf("Count at 4s = %d, want 2", n)
	}
}

func TestLatencyWindowNil(t *testing.T) {
	var w *LatencyWindow
	w.Record(t0, ms1)
	w.RecordFailure(t0, ms1)
	if d, ok := w.Threshold(t0); d != 0 || ok {
		t.Errorf("nil Threshold = %v, %v", d, ok)
	}
	if d, ok := w.Quantile(t0, 0.5); d != 0 || ok {
		t.Errorf("nil Quantile = %v, %v", d, ok)
	}
	if w.Count(t0) != 0 || w.Clamped() != 0 {
		t.Errorf("nil window counts something")
	}
}

func TestLatencyWindowConcurrentRecord(t *testing.T) {
	const goroutines, per = 8, 5000
	w := NewLatencyWindow(LatencyConfig{Window: 4 * time.Second, MinSamples: 1}, t0)
	now := t0.Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				w.Record(now, time.Duration(g*per+i)*time.Microsecond)
				if i%500 == 0 {
					w.Threshold(now)
					w.Count(now)
				}
			}
		})
	}
	wg.Wait()
	if n := w.Count(now); n != goroutines*per {
		t.Errorf("Count = %d, want %d", n, goroutines*per)
	}
	var want [numBuckets]uint64
	for i := range goroutines * per {
		want[bucketIndex(time.Duration(i)*time.Microsecond)]++
	}
	var got [numBuckets]uint64
	w.snapshot(w.clock.epoch(now)>>periodShift, &got)
	if got != want {
		t.Errorf("bucket counts differ from a sequential count")
	}
}

// TestLatencyWindowConcurrentTurnover races many first records of a slice
// on a ring full of old samples. Nothing old may survive; new records may
// be lost only while the ring is being cleared.
func TestLatencyWindowConcurrentTurnover(t *testing.T) {
	const goroutines, per = 8, 2000
	w := NewLatencyWindow(LatencyConfig{Window: 4 * time.Second, MinSamples: 1}, t0)
	for range 10000 {
		w.Record(t0, ms1)
	}
	for rev := 1; rev <= 5; rev++ {
		now := t0.Add(time.Duration(4*rev) * time.Second) // same ring as the last revolution
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				<-start
				for i := range per {
					w.Record(now, time.Duration(g*per+i)*time.Microsecond+time.Second)
				}
			})
		}
		close(start)
		wg.Wait()
		n := w.Count(now)
		if n > goroutines*per || n == 0 {
			t.Fatalf("revolution %d: Count = %d, want in (0, %d]", rev, n, goroutines*per)
		}
		if d, _ := w.Quantile(now, 0); d <= time.Second {
			t.Fatalf("revolution %d: smallest sample %v: an old sample survived the turnover", rev, d)
		}
		if lost := goroutines*per - n; lost > 0 {
			t.Logf("revolution %d: %d of %d records lost to the turnover", rev, lost, goroutines*per)
		}
	}
}

func TestLatencyWindowAllocs(t *testing.T) {
	w := NewLatencyWindow(LatencyConfig{MinSamples: 1}, t0)
	now := t0.Add(time.Second)
	for name, f := range map[string]func(){
		"Record":        func() { w.Record(now, 3*time.Millisecond) },
		"RecordFailure": func() { w.RecordFailure(now, time.Millisecond) },
		"Threshold":     func() { w.Threshold(now) },
		"Quantile":      func() { w.Quantile(now, 0.99) },
		"Count":         func() { w.Count(now) },
		"turnover":      func() { now = now.Add(7500 * time.Millisecond); w.Record(now, time.Millisecond) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %v allocations, want 0", name, a)
		}
	}
	if a := testing.AllocsPerRun(10, func() { NewLatencyWindow(LatencyConfig{}, t0) }); a != 1 {
		t.Errorf("NewLatencyWindow: %v allocations, want 1", a)
	}
}

// TestLatencyWindowSize holds a window to the allocation size class it
// is in, 4864 bytes (runtime/sizeclasses.go): the next is 5376, a
// scope's every policy together must fit in 8 KB, and the marks
// (three of 424 bytes) were sized to what this class leaves.
func TestLatencyWindowSize(t *testing.T) {
	size := unsafe.Sizeof(LatencyWindow{})
	t.Logf("LatencyWindow: %d bytes", size)
	if size > 4864 {
		t.Errorf("LatencyWindow takes %d bytes, want at most 4864", size)
	}
}

// benchDurations is a spread of latencies for the benchmarks.
var benchDurations = func() []time.Duration {
	rng := rand.New(rand.NewPCG(7, 7))
	ds := make([]time.Duration, 1024)
	for i := range ds {
		ds[i] = time.Duration(math.Exp(math.Log(float64(20*time.Millisecond)) + rng.NormFloat64()))
	}
	return ds
}()

func BenchmarkLatencyWindowRecord(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	now := origin.Add(time.Second)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w.Record(now, benchDurations[i&1023])
	}
}

func BenchmarkLatencyWindowRecordParallel(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	now := origin.Add(time.Second)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			w.Record(now, benchDurations[i&1023])
		}
	})
}

func BenchmarkLatencyWindowQuantile(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	now := origin.Add(time.Second)
	for _, d := range benchDurations {
		w.Record(now, d)
	}
	if _, ok := w.Threshold(now); !ok {
		b.Fatal("not warm")
	}
	b.ReportAllocs()
	for b.Loop() {
		w.Threshold(now)
	}
}

func BenchmarkLatencyWindowQuantileScan(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	for i, d := range benchDurations {
		w.Record(origin.Add(time.Duration(i)*30*time.Millisecond), d) // all four rings
	}
	now := origin.Add(29 * time.Second)
	b.ReportAllocs()
	for b.Loop() {
		w.Quantile(now, 0.99)
	}
}

// BenchmarkLatencyWindowThresholdRescan is the memo's refresh, once a
// period: each op moves to the next period (and, every eighth, to a new
// slice, whose ring Record clears), records a sample and reads Threshold,
// which scans the window, takes the period's mark and reads the recent
// samples against the mark of two periods before.
func BenchmarkLatencyWindowThresholdRescan(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{MinSamples: -1}, origin)
	period := time.Duration(w.clock.slice)
	now := origin
	for i, d := range benchDurations {
		w.Record(origin.Add(time.Duration(i)*30*time.Millisecond), d) // all four rings
		now = origin.Add(time.Duration(i) * 30 * time.Millisecond)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(period)
		w.Record(now, benchDurations[i&1023])
		w.Threshold(now)
	}
}

// BenchmarkLatencyWindowThresholdRescanBusy is a rescan within a period of
// a window busy enough for the recent samples (320 samples a period), as
// when the records above a threshold the recent samples were read for end
// it: the window, the recent samples since the marks for a fall and for a
// rise.
func BenchmarkLatencyWindowThresholdRescanBusy(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	period := time.Duration(w.clock.slice)
	var now time.Time
	for i := range 40 * 320 { // 40 periods
		now = origin.Add(time.Duration(i) * period / 320)
		w.Record(now, benchDurations[i&1023])
		w.Threshold(now)
	}
	b.ReportAllocs()
	for b.Loop() {
		w.memo.Store(w.memo.Load() & memoBucket) // ended, as by records above it
		w.Threshold(now)
	}
}

// BenchmarkLatencyWindowCall is what a hedged call costs the window: one
// Threshold and one Record, at 10,000 calls a second of the clock, so that
// each op pays its share of the rescans, once a period and whenever the
// records above a threshold end it.
func BenchmarkLatencyWindowCall(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	w := NewLatencyWindow(LatencyConfig{}, origin)
	now := origin
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(100 * time.Microsecond)
		w.Threshold(now)
		w.Record(now, benchDurations[i&1023])
	}
}
