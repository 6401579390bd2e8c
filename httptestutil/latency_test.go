package httptestutil_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/resilix/resilix/httptestutil"
)

func samples(l httptestutil.Latency, seed uint64, n int) []time.Duration {
	r := rand.New(rand.NewPCG(seed, seed))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = l.Sample(r)
	}
	return out
}

func TestConstant(t *testing.T) {
	for _, d := range samples(httptestutil.Constant(42*time.Millisecond), 1, 10) {
		if d != 42*time.Millisecond {
			t.Fatalf("Constant sample = %v, want 42ms", d)
		}
	}
}

func TestUniform(t *testing.T) {
	lo, hi := 10*time.Millisecond, 20*time.Millisecond
	s := samples(httptestutil.Uniform(lo, hi), 1, 10000)
	var sum time.Duration
	for _, d := range s {
		if d < lo || d > hi {
			t.Fatalf("Uniform sample %v outside [%v, %v]", d, lo, hi)
		}
		sum += d
	}
	if mean := sum / time.Duration(len(s)); mean < 14900*time.Microsecond || mean > 15100*time.Microsecond {
		t.Errorf("Uniform mean = %v, want about 15ms", mean)
	}
	for _, d := range samples(httptestutil.Uniform(hi, lo), 1, 10) {
		if d != hi {
			t.Fatalf("Uniform(hi, lo) sample = %v, want %v", d, hi)
		}
	}
}

func TestBimodal(t *testing.T) {
	fast, slow := time.Millisecond, time.Second
	count := func(p float64) int {
		n := 0
		for _, d := range samples(httptestutil.Bimodal(fast, slow, p), 3, 10000) {
			switch d {
			case slow:
				n++
			case fast:
			default:
				t.Fatalf("Bimodal sample %v is neither fast nor slow", d)
			}
		}
		return n
	}
	if n := count(0); n != 0 {
		t.Errorf("pSlow 0: %d slow samples, want 0", n)
	}
	if n := count(1); n != 10000 {
		t.Errorf("pSlow 1: %d slow samples, want 10000", n)
	}
	// 10000 * 0.1 = 1000, sd 30.
	if n := count(0.1); n < 850 || n > 1150 {
		t.Errorf("pSlow 0.1: %d slow samples of 10000, want about 1000", n)
	}
}

func TestLogNormal(t *testing.T) {
	median := 50 * time.Millisecond
	s := samples(httptestutil.LogNormal(median, 1), 5, 10001)
	slices.Sort(s)
	if got := s[len(s)/2]; got < 47*time.Millisecond || got > 53*time.Millisecond {
		t.Errorf("LogNormal median = %v, want about %v", got, median)
	}
	// exp(2.326) ≈ 10.2: the 99th percentile is about ten times the median.
	if p99 := s[len(s)*99/100]; p99 < 400*time.Millisecond || p99 > 650*time.Millisecond {
		t.Errorf("LogNormal p99 = %v, want about 510ms", p99)
	}
	for _, d := range samples(httptestutil.LogNormal(median, 0), 5, 10) {
		if d != median {
			t.Fatalf("sigma 0 sample = %v, want %v", d, median)
		}
	}
	if d := samples(httptestutil.LogNormal(time.Hour, 1e6), 5, 1)[0]; d < 0 {
		t.Errorf("huge sigma sample = %v, want clamped non-negative", d)
	}
}

func TestMix(t *testing.T) {
	a, b := time.Millisecond, 2*time.Millisecond
	m := httptestutil.Mix(
		httptestutil.Weighted{Weight: 1, Latency: httptestutil.Constant(a)},
		httptestutil.Weighted{Weight: 0, Latency: httptestutil.Constant(time.Hour)},
		httptestutil.Weighted{Weight: 3, Latency: httptestutil.Constant(b)},
	)
	var na int
	for _, d := range samples(m, 9, 10000) {
		switch d {
		case a:
			na++
		case b:
		default:
			t.Fatalf("Mix sample %v not from a positive-weight component", d)
		}
	}
	if na < 2300 || na > 2700 {
		t.Errorf("Mix: %d of 10000 from weight 1 of 4, want about 2500", na)
	}
	if d := samples(httptestutil.Mix(), 9, 1)[0]; d != 0 {
		t.Errorf("empty Mix sample = %v, want 0", d)
	}
	if d := samples(httptestutil.Mix(httptestutil.Weighted{Weight: 1}), 9, 1)[0]; d != 0 {
		t.Errorf("Mix with nil Latency sample = %v, want 0", d)
	}
}

func TestLatencyFunc(t *testing.T) {
	l := httptestutil.LatencyFunc(func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(10)) })
	if !slices.Equal(samples(l, 1, 20), samples(l, 1, 20)) {
		t.Error("same seed gave different sequences")
	}
}
