package estimator

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// counterStep is one step of a table-driven Counters test: at t after the
// origin, add delta to counter i (if delta is not zero), then expect the
// sums of all counters.
type counterStep struct {
	at    time.Duration
	i     int
	delta uint64
	sums  []uint64
}

func runCounterSteps(t *testing.T, window time.Duration, n int, steps []counterStep) {
	t.Helper()
	c := NewCounters(window, n, t0)
	for k, s := range steps {
		now := t0.Add(s.at)
		if s.delta != 0 {
			c.Add(now, s.i, s.delta)
		}
		got := make([]uint64, n)
		c.Sums(now, got)
		if diff := cmp.Diff(s.sums, got); diff != "" {
			t.Errorf("step %d (at %v): Sums (-want +got):\n%s", k, s.at, diff)
		}
		for i := range n {
			if v := c.Sum(now, i); v != s.sums[i] {
				t.Errorf("step %d (at %v): Sum(%d) = %d, want %d", k, s.at, i, v, s.sums[i])
			}
		}
	}
}

func TestCountersRotation(t *testing.T) {
	// Requests and accepts over a 4s window: slices of 1s.
	runCounterSteps(t, 4*time.Second, 2, []counterStep{
		{at: 0, sums: []uint64{0, 0}},
		{at: 0, i: 0, delta: 10, sums: []uint64{10, 0}},
		{at: 0, i: 1, delta: 8, sums: []uint64{10, 8}},
		{at: time.Second, i: 0, delta: 5, sums: []uint64{15, 8}},
		{at: 2500 * time.Millisecond, i: 1, delta: 5, sums: []uint64{15, 13}},
		{at: 4*time.Second - 1, sums: []uint64{15, 13}},
		// Epoch 4: epoch 0 is out of the window, before anyone clears it.
		{at: 4 * time.Second, sums: []uint64{5, 5}},
		{at: 4 * time.Second, i: 0, delta: 1, sums: []uint64{6, 5}},
		{at: 5 * time.Second, sums: []uint64{1, 5}},
		{at: 6 * time.Second, sums: []uint64{1, 0}},
		{at: 8 * time.Second, sums: []uint64{0, 0}},
		// Idle for revolutions: nothing left over.
		{at: 16 * time.Second, sums: []uint64{0, 0}},
		{at: 16 * time.Second, i: 1, delta: 2, sums: []uint64{0, 2}},
		{at: time.Hour, sums: []uint64{0, 0}},
	})
}

func TestCountersPriorityMix(t *testing.T) {
	// Four buckets, the traffic mix per priority, at the default window.
	runCounterSteps(t, 0, 4, []counterStep{
		{at: 0, i: 0, delta: 1, sums: []uint64{1, 0, 0, 0}},
		{at: 7 * time.Second, i: 3, delta: 4, sums: []uint64{1, 0, 0, 4}},
		{at: 7500 * time.Millisecond, i: 2, delta: 2, sums: []uint64{1, 0, 2, 4}},
		{at: 29 * time.Second, i: 1, delta: 1, sums: []uint64{1, 1, 2, 4}},
		// Epoch 4 (30s / 7.5s): both adds of epoch 0 (at 0 and 7s) leave together.
		{at: 30 * time.Second, sums: []uint64{0, 1, 2, 0}},
		{at: 37500 * time.Millisecond, sums: []uint64{0, 1, 0, 0}},
	})
}

func TestCountersSumsLength(t *testing.T) {
	c := NewCounters(time.Second, 3, t0)
	c.Add(t0, 0, 1)
	c.Add(t0, 1, 2)
	c.Add(t0, 2, 3)
	short := []uint64{9}
	c.Sums(t0, short)
	if diff := cmp.Diff([]uint64{1}, short); diff != "" {
		t.Errorf("short dst (-want +got):\n%s", diff)
	}
	long := []uint64{9, 9, 9, 9, 9}
	c.Sums(t0, long)
	if diff := cmp.Diff([]uint64{1, 2, 3, 9, 9}, long); diff != "" {
		t.Errorf("long dst (-want +got):\n%s", diff)
	}
	if c.Len() != 3 {
		t.Errorf("Len = %d, want 3", c.Len())
	}
	empty := NewCounters(time.Second, -1, t0)
	if empty.Len() != 0 {
		t.Errorf("Len of n = -1: %d, want 0", empty.Len())
	}
	empty.Sums(t0, nil)
}

func TestCountersBadIndex(t *testing.T) {
	c := NewCounters(time.Second, 2, t0)
	for _, i := range []int{-1, 2} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Add(%d) did not panic", i)
				}
			}()
			c.Add(t0, i, 1)
		}()
	}
	if got := c.Sum(t0, 0) + c.Sum(t0, 1); got != 0 {
		t.Errorf("a bad index changed a counter: %d", got)
	}
}

func TestCountersNil(t *testing.T) {
	var c *Counters
	c.Add(t0, 0, 1)
	dst := []uint64{5}
	c.Sums(t0, dst)
	if c.Sum(t0, 0) != 0 || dst[0] != 0 || c.Len() != 0 {
		t.Errorf("nil Counters counts something")
	}
}

func TestCountersConcurrent(t *testing.T) {
	const goroutines, per = 8, 5000
	c := NewCounters(4*time.Second, 2, t0)
	now := t0.Add(time.Second)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			sums := make([]uint64, 2)
			for i := range per {
				c.Add(now, 0, 1)
				c.Add(now, 1, 2)
				if i%500 == 0 {
					c.Sums(now, sums)
				}
			}
		})
	}
	wg.Wait()
	if a, b := c.Sum(now, 0), c.Sum(now, 1); a != goroutines*per || b != 2*goroutines*per {
		t.Errorf("sums = %d, %d; want %d, %d", a, b, goroutines*per, 2*goroutines*per)
	}
}

func TestCountersConcurrentTurnover(t *testing.T) {
	const goroutines, per = 8, 2000
	c := NewCounters(4*time.Second, 1, t0)
	c.Add(t0, 0, 1<<40)
	for rev := 1; rev <= 5; rev++ {
		now := t0.Add(time.Duration(4*rev) * time.Second)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				for range per {
					c.Add(now, 0, 1)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := c.Sum(now, 0); n > goroutines*per || n == 0 {
			t.Fatalf("revolution %d: Sum = %d, want in (0, %d]", rev, n, goroutines*per)
		}
	}
}

func TestCountersAllocs(t *testing.T) {
	c := NewCounters(0, 4, t0)
	now := t0
	dst := make([]uint64, 4)
	for name, f := range map[string]func(){
		"Add":      func() { c.Add(now, 2, 1) },
		"Sum":      func() { c.Sum(now, 2) },
		"Sums":     func() { c.Sums(now, dst) },
		"turnover": func() { now = now.Add(7500 * time.Millisecond); c.Add(now, 1, 1) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %v allocations, want 0", name, a)
		}
	}
}

func BenchmarkCountersAdd(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	c := NewCounters(0, 4, origin)
	now := origin.Add(time.Second)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.Add(now, i&3, 1)
	}
}

func BenchmarkCountersSums(b *testing.B) {
	origin := time.Now() // callers pass time.Now(): a monotonic reading
	c := NewCounters(0, 4, origin)
	now := origin.Add(time.Second)
	dst := make([]uint64, 4)
	b.ReportAllocs()
	for b.Loop() {
		c.Sums(now, dst)
	}
}

// TestCountersDatedASliceEarly holds Slice's promise: a count added with a
// time up to a slice before the newest writer's is summed, whether its ring
// holds that slice or a stale one, and leaves the sums no more than a slice
// sooner than one dated on time.
func TestCountersDatedASliceEarly(t *testing.T) {
	if got, want := Slice(4*time.Second), time.Second; got != want {
		t.Fatalf("Slice(4s) = %v, want %v", got, want)
	}
	if got, want := Slice(0), 30*time.Second/4; got != want {
		t.Fatalf("Slice(0) = %v, want %v", got, want)
	}
	origin := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return origin.Add(d) }
	c := NewCounters(4*time.Second, 1, origin)
	c.Add(at(5*time.Second+500*time.Millisecond), 0, 7) // epoch 5, in the ring epoch 9 will use
	now := at(10*time.Second + 200*time.Millisecond)    // epoch 10
	c.Add(now, 0, 1)
	c.Add(now.Add(-900*time.Millisecond), 0, 1) // epoch 9: its ring held epoch 5
	c.Add(now.Add(-100*time.Millisecond), 0, 1) // epoch 10, dated early within it
	for _, step := range []struct {
		at   time.Duration
		want uint64
	}{
		{10*time.Second + 200*time.Millisecond, 3},
		{12*time.Second + 999*time.Millisecond, 3},
		{13 * time.Second, 2}, // epoch 9 has left
		{14 * time.Second, 0},
	} {
		if got := c.Sum(at(step.at), 0); got != step.want {
			t.Errorf("Sum at %v = %d, want %d", step.at, got, step.want)
		}
	}
}
