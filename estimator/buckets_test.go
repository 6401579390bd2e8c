package estimator

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBucketLayout(t *testing.T) {
	if numBuckets != 200 {
		t.Errorf("numBuckets = %d, want 200", numBuckets)
	}
	if MaxDuration < 134*time.Second {
		t.Errorf("MaxDuration = %v, want at least 134s", MaxDuration)
	}
	if got := bucketUpper(numBuckets - 1); got != MaxDuration {
		t.Errorf("upper bound of the top bucket = %v, want MaxDuration %v", got, MaxDuration)
	}
	if got := bucketLower(0); got != 0 {
		t.Errorf("lower bound of bucket 0 = %v, want 0", got)
	}
	for i := range numBuckets {
		lo, hi := bucketLower(i), bucketUpper(i)
		if lo >= hi {
			t.Fatalf("bucket %d: empty range [%d, %d)", i, lo, hi)
		}
		if got := bucketIndex(lo); got != i {
			t.Errorf("bucketIndex(%d) = %d, want %d (lower bound)", lo, got, i)
		}
		if got := bucketIndex(hi - 1); got != i {
			t.Errorf("bucketIndex(%d) = %d, want %d (upper bound - 1)", hi-1, got, i)
		}
		width := hi - lo
		switch {
		case i < linearBuckets:
			if width != 1<<unitShift {
				t.Errorf("linear bucket %d: width %d, want %d", i, width, 1<<unitShift)
			}
		case width*8 > lo:
			t.Errorf("bucket %d: width %d is more than 12.5%% of its lower bound %d", i, width, lo)
		}
	}
	// Fixed points, spelled out.
	for _, c := range []struct {
		d      time.Duration
		bucket int
		upper  time.Duration
	}{
		{-time.Second, 0, 1024},
		{0, 0, 1024},
		{1023, 0, 1024},
		{1024, 1, 2048},
		{8191, 7, 8192},
		{8192, 8, 9216},
		{16384, 16, 18432},
		{time.Millisecond, 63, 1048576},
		{MaxDuration - 1, numBuckets - 1, MaxDuration},
		{MaxDuration, numBuckets - 1, MaxDuration},
		{math.MaxInt64, numBuckets - 1, MaxDuration},
	} {
		i := bucketIndex(c.d)
		if i != c.bucket || bucketUpper(i) != c.upper {
			t.Errorf("bucketIndex(%d) = %d (upper %d), want %d (upper %d)", c.d, i, bucketUpper(i), c.bucket, c.upper)
		}
	}
}

func FuzzBucketIndex(f *testing.F) {
	for _, d := range []int64{0, 1, 1023, 1024, 8191, 8192, 9215, 9216, 16383, 16384,
		int64(time.Millisecond), int64(MaxDuration) - 1, int64(MaxDuration), -1, math.MinInt64, math.MaxInt64} {
		f.Add(d, d+1)
	}
	f.Fuzz(func(t *testing.T, a, b int64) {
		da, db := time.Duration(a), time.Duration(b)
		i := bucketIndex(da)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketIndex(%d) = %d, out of [0, %d)", a, i, numBuckets)
		}
		if da > db {
			da, db = db, da
		}
		if ia, ib := bucketIndex(da), bucketIndex(db); ia > ib {
			t.Fatalf("not monotone: bucketIndex(%d) = %d > bucketIndex(%d) = %d", da, ia, db, ib)
		}
		d := time.Duration(a)
		switch {
		case d < 0:
			if i != 0 {
				t.Fatalf("bucketIndex(%d) = %d, want 0", d, i)
			}
		case d >= MaxDuration:
			if i != numBuckets-1 {
				t.Fatalf("bucketIndex(%d) = %d, want the top bucket", d, i)
			}
		default:
			lo, hi := bucketLower(i), bucketUpper(i)
			if d < lo || d >= hi {
				t.Fatalf("bucket %d = [%d, %d) does not contain %d", i, lo, hi, d)
			}
			if d >= linearNanos && (hi-lo)*8 > lo {
				t.Fatalf("bucket %d = [%d, %d) is wider than 12.5%% of its lower bound", i, lo, hi)
			}
		}
	})
}

func TestEpoch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	windows := []time.Duration{0, 1, 4, 5, 8, 12, 4 * time.Second, 30 * time.Second,
		time.Hour, 4 * 7919 * time.Microsecond, math.MaxInt64}
	for range 50 {
		windows = append(windows, time.Duration(rng.Int64N(math.MaxInt64)))
	}
	for _, w := range windows {
		c := newClock(w, t0)
		if c.slice == 0 {
			t.Fatalf("window %v: slice 0", w)
		}
		check := func(x uint64) {
			t.Helper()
			got := c.epoch(t0.Add(time.Duration(x)))
			if want := x / c.slice; got != want {
				t.Fatalf("window %v, slice %d: epoch(%d) = %d, want %d", w, c.slice, x, got, want)
			}
		}
		for _, x := range []uint64{0, 1, c.slice - 1, c.slice, c.slice + 1, 2*c.slice - 1, 2 * c.slice,
			math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 - c.slice} {
			if x <= math.MaxInt64 {
				check(x)
			}
		}
		for range 2000 {
			x := rng.Uint64N(math.MaxInt64)
			check(x >> rng.UintN(63))
			if m := x / c.slice * c.slice; m > 0 { // either side of a slice boundary
				check(m)
				check(m - 1)
			}
		}
	}
	// Before the origin: clamp to epoch 0.
	c := newClock(4*time.Second, t0)
	for _, d := range []time.Duration{-1, -time.Hour, math.MinInt64} {
		if got := c.epoch(t0.Add(d)); got != 0 {
			t.Errorf("epoch(origin%v) = %d, want 0", d, got)
		}
	}
	if got := c.epoch(time.Time{}); got != 0 {
		t.Errorf("epoch(zero time) = %d, want 0", got)
	}
	if c.slice != uint64(time.Second) {
		t.Errorf("slice of a 4s window = %d, want 1s", c.slice)
	}
	if d := newClock(0, t0); d.slice != uint64(defaultWindow/4) {
		t.Errorf("slice of a zero window = %d, want %d", d.slice, defaultWindow/4)
	}
}
