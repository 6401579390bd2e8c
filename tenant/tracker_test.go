package tenant

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// TestTenantMemoryIsBounded: a million distinct ids leave the tracker the
// size it was built with, by construction (no allocation on any Add, at most
// Capacity ids followed per generation) and by measurement.
func TestTenantMemoryIsBounded(t *testing.T) {
	const distinct = 1_000_000
	ids := make([]string, 1<<12)
	for i := range ids {
		ids[i] = "tenant-" + strconv.Itoa(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	tr := NewTracker(0, time.Minute, t0)
	var buf []byte
	for i := range distinct {
		buf = strconv.AppendInt(append(buf[:0], "id-"...), int64(i), 10)
		tr.Add(t0, string(buf)) // the conversion is the test's, not the tracker's
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(tr)

	if got := tr.Active(t0); got != DefaultCapacity {
		t.Errorf("Active = %d after %d distinct ids, want the capacity %d", got, distinct, DefaultCapacity)
	}
	if got := tr.Total(t0); got != distinct {
		t.Errorf("Total = %d, want %d", got, distinct)
	}
	// About 13 KB by construction; allow for the runtime's own noise.
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 256<<10 {
		t.Errorf("heap grew by %d bytes over %d distinct ids, want a fixed ~13 KB", grew, distinct)
	}

	// By construction: neither a new id (which evicts) nor a tracked one
	// allocates.
	i := 0
	if n := testing.AllocsPerRun(10000, func() {
		tr.Add(t0, ids[i%len(ids)])
		i++
	}); n != 0 {
		t.Errorf("Add of new ids allocates %v times, want 0", n)
	}
	tr.Add(t0, "steady")
	if n := testing.AllocsPerRun(1000, func() {
		tr.Add(t0, "steady")
		_ = tr.Excess(t0, "steady")
	}); n != 0 {
		t.Errorf("Add and Excess of a tracked id allocate %v times, want 0", n)
	}
	long := strings.Repeat("x", 200)
	if n := testing.AllocsPerRun(1000, func() {
		tr.Add(t0, long)
		_ = tr.Excess(t0, long)
	}); n != 0 {
		t.Errorf("Add and Excess of a long id allocate %v times, want 0", n)
	}
}

// TestHeavyTenantFound: a tenant at 10× another is heavy, the other light,
// even among a crowd of one-off ids that churn the summary.
func TestHeavyTenantFound(t *testing.T) {
	tr := NewTracker(16, time.Minute, t0)
	r := rand.New(rand.NewPCG(3, 4))
	// Per 100 admissions: heavy 10, light 1, and 89 spread over a thousand
	// ids, so the summary is full and churning. The fair share is then
	// 1/16 of the admissions: light (1%) is below it, heavy (10%) above.
	for i := range 20000 {
		switch {
		case i%100 == 0:
			tr.Add(t0, "light")
		case i%10 == 5:
			tr.Add(t0, "heavy")
		default:
			tr.Add(t0, "noise-"+strconv.Itoa(r.IntN(1000)))
		}
	}
	heavy, light := tr.Excess(t0, "heavy"), tr.Excess(t0, "light")
	if heavy <= 0 {
		t.Errorf("Excess(heavy) = %v, want > 0", heavy)
	}
	if light > 0 {
		t.Errorf("Excess(light) = %v, want <= 0", light)
	}
	if got := tr.Excess(t0, "never-seen"); got != -1 {
		t.Errorf("Excess(never-seen) = %v, want -1", got)
	}

	// Just the two of them: heavy is at 10/11 of the admissions, twice its
	// fair share less a little; light at 2/11.
	tr = NewTracker(0, time.Minute, t0)
	for range 100 {
		for range 10 {
			tr.Add(t0, "heavy")
		}
		tr.Add(t0, "light")
	}
	if got, want := tr.Excess(t0, "heavy"), 20.0/11-1; !near(got, want) {
		t.Errorf("Excess(heavy) = %v, want %v", got, want)
	}
	if got, want := tr.Excess(t0, "light"), 2.0/11-1; !near(got, want) {
		t.Errorf("Excess(light) = %v, want %v", got, want)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestSpaceSavingBounds checks the guarantees of Metwally et al. on a skewed
// stream: each tracked id's true count is within [lower, upper], the error
// is at most N/m, and every id above N/m is tracked.
func TestSpaceSavingBounds(t *testing.T) {
	const m, n = 32, 50000
	tr := NewTracker(m, time.Minute, t0)
	r := rand.New(rand.NewPCG(5, 6))
	zipf := rand.NewZipf(r, 1.2, 1, 999)
	truth := map[string]uint64{}
	for range n {
		id := "t" + strconv.FormatUint(zipf.Uint64(), 10)
		truth[id]++
		tr.Add(t0, id)
	}
	tracked := 0
	for id, c := range truth {
		lo, hi := tr.Count(t0, id)
		if hi == 0 {
			if c > n/m {
				t.Errorf("%s: %d admissions, above N/m = %d, but not tracked", id, c, n/m)
			}
			continue
		}
		tracked++
		if c < lo || c > hi {
			t.Errorf("%s: true count %d outside [%d, %d]", id, c, lo, hi)
		}
		if hi-lo > n/m {
			t.Errorf("%s: error %d above N/m = %d", id, hi-lo, n/m)
		}
	}
	if tracked != m {
		t.Errorf("%d ids tracked, want %d", tracked, m)
	}
}

// TestTrackerWindow drives the two generations with explicit instants.
func TestTrackerWindow(t *testing.T) {
	const window = 10 * time.Second // generations of 5s
	tr := NewTracker(4, window, t0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	tr.Add(at(0), "a")
	tr.Add(at(time.Second), "a")
	tr.Add(at(2*time.Second), "b")
	steps := []struct {
		at       time.Duration
		add      string
		active   int
		total    uint64
		aLo, aHi uint64
		bExcess  float64
	}{
		// Same generation.
		{at: 4 * time.Second, active: 2, total: 3, aLo: 2, aHi: 2, bExcess: 2.0/3 - 1},
		// Next generation: the first is now the previous one, still counted.
		{at: 6 * time.Second, add: "b", active: 2, total: 4, aLo: 2, aHi: 2, bExcess: 0},
		{at: 9 * time.Second, add: "c", active: 3, total: 5, aLo: 2, aHi: 2, bExcess: 2*3.0/5 - 1},
		// One more: the admissions of [0, 5s) are gone.
		{at: 10 * time.Second, active: 2, total: 2, aLo: 0, aHi: 0, bExcess: 0},
		// Two generations later, everything is gone.
		{at: 21 * time.Second, active: 0, total: 0, aLo: 0, aHi: 0, bExcess: -1},
		// An instant from the past counts in the current generation.
		{at: 3 * time.Second, add: "b", active: 1, total: 1, aLo: 0, aHi: 0, bExcess: 0},
	}
	for _, s := range steps {
		now := at(s.at)
		if s.add != "" {
			tr.Add(now, s.add)
		}
		if got := tr.Active(now); got != s.active {
			t.Errorf("at %v: Active = %d, want %d", s.at, got, s.active)
		}
		if got := tr.Total(now); got != s.total {
			t.Errorf("at %v: Total = %d, want %d", s.at, got, s.total)
		}
		if lo, hi := tr.Count(now, "a"); lo != s.aLo || hi != s.aHi {
			t.Errorf("at %v: Count(a) = [%d, %d], want [%d, %d]", s.at, lo, hi, s.aLo, s.aHi)
		}
		if got := tr.Excess(now, "b"); !near(got, s.bExcess) {
			t.Errorf("at %v: Excess(b) = %v, want %v", s.at, got, s.bExcess)
		}
	}
}

// TestTrackerLinksAcrossGenerations: an id in both generations is one
// tenant, also after it is evicted from the current one.
func TestTrackerLinksAcrossGenerations(t *testing.T) {
	tr := NewTracker(2, 10*time.Second, t0)
	for _, id := range []string{"a", "a", "b"} {
		tr.Add(t0, id)
	}
	now := t0.Add(5 * time.Second) // prev: a=2, b=1
	tr.Add(now, "a")
	tr.Add(now, "c")
	if got := tr.Active(now); got != 3 {
		t.Fatalf("Active = %d, want 3 (a, b, c)", got)
	}
	// d evicts a or c from the current generation (both at count 1... a is
	// at 1, c at 1; the first smallest goes).
	tr.Add(now, "d")
	if got := tr.Active(now); got != 4 {
		t.Errorf("after an eviction, Active = %d, want 4", got)
	}
	if lo, hi := tr.Count(now, "a"); lo != 2 || hi != 2 {
		t.Errorf("Count(a) = [%d, %d], want [2, 2]: its previous generation only", lo, hi)
	}
}

// TestTrackerLongIDs: ids longer than MaxIDLen are told apart by hash.
func TestTrackerLongIDs(t *testing.T) {
	tr := NewTracker(8, time.Minute, t0)
	base := strings.Repeat("p", MaxIDLen)
	a, b := base+"-a", base+"-b"
	tr.Add(t0, a)
	tr.Add(t0, a)
	tr.Add(t0, b)
	tr.Add(t0, base) // exactly MaxIDLen: stored as is
	if lo, _ := tr.Count(t0, a); lo != 2 {
		t.Errorf("Count(a) = %d, want 2", lo)
	}
	if lo, _ := tr.Count(t0, b); lo != 1 {
		t.Errorf("Count(b) = %d, want 1", lo)
	}
	if lo, _ := tr.Count(t0, base); lo != 1 {
		t.Errorf("Count(base) = %d, want 1", lo)
	}
	if got := tr.Active(t0); got != 3 {
		t.Errorf("Active = %d, want 3", got)
	}
}

// TestTrackerTableChurn evicts through a small table many times and checks
// every tracked id can still be found (backward-shift deletion keeps probe
// runs intact).
func TestTrackerTableChurn(t *testing.T) {
	tr := NewTracker(8, time.Minute, t0)
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 100000 {
		id := strconv.Itoa(r.IntN(50))
		tr.Add(t0, id)
		if i%97 == 0 {
			tr.mu.Lock()
			c := tr.cur
			for j := 0; j < c.n; j++ {
				s := &c.slots[j]
				k := tr.key(string(s.id[:s.n]))
				if got := c.lookup(&k); got != j {
					tr.mu.Unlock()
					t.Fatalf("after %d adds: slot %d (%q) found at %d", i, j, s.id[:s.n], got)
				}
			}
			tr.mu.Unlock()
		}
	}
}

func TestNilTracker(t *testing.T) {
	var tr *Tracker
	tr.Add(t0, "a")
	if got := tr.Excess(t0, "a"); got != 0 {
		t.Errorf("nil Excess = %v, want 0", got)
	}
	if tr.Active(t0) != 0 || tr.Total(t0) != 0 || tr.Capacity() != 0 {
		t.Error("nil tracker reports something")
	}
}

func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(16, time.Minute, t0)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 5000 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				id := strconv.Itoa(g*7 + i%20)
				tr.Add(now, id)
				_ = tr.Excess(now, id)
			}
		})
	}
	wg.Wait()
	if got := tr.Total(t0.Add(5 * time.Second)); got != 20000 {
		t.Errorf("Total = %d, want 20000", got)
	}
}
