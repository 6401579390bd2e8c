package lane

import (
	"slices"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// end is one attempt's end for stalls.ended, in ms.
type end struct {
	t, sent, latest int64
	inFlight        bool
}

func TestStallsEnded(t *testing.T) {
	// steady: ends every ms from 1 to 10, each sent 1 ms before, so that
	// the mean time between ends is 1 ms and a gap is 8 ms or more.
	steady := func(more ...end) []end {
		var es []end
		for i := int64(1); i <= 10; i++ {
			es = append(es, end{t: i, sent: i - 1, latest: i})
		}
		return append(es, more...)
	}
	for _, tc := range []struct {
		name  string
		quiet int64 // ms
		ends  []end
		want  []gap // ms
	}{
		{"steady", 0, steady(), nil},
		{"an end 8 ms after the last, sent before it", 0,
			steady(end{t: 18, sent: 9, latest: 10}), []gap{{10, 18}}},
		{"7 ms is within the rule", 0,
			steady(end{t: 17, sent: 9, latest: 10}), nil},
		{"sent after the last end, alone: the gap runs from its send", 0,
			steady(end{t: 30, sent: 11, latest: 11}), []gap{{11, 30}}},
		{"sent after the last end, another in flight", 0,
			steady(end{t: 30, sent: 20, latest: 20, inFlight: true}), []gap{{10, 30}}},
		{"alone, a later send: the gap runs from the latest send", 0,
			steady(end{t: 30, sent: 11, latest: 12}), []gap{{12, 30}}},
		{"sent long after the last end: the key went quiet", 0,
			steady(end{t: 40, sent: 25, latest: 25}), nil},
		{"quiet above the mean's rule", 20,
			steady(end{t: 25, sent: 9, latest: 10}), nil},
		{"quiet reached", 20,
			steady(end{t: 30, sent: 9, latest: 10}), []gap{{10, 30}}},
		{"an end before the last is no news", 0,
			steady(end{t: 5, sent: 0, latest: 10}, end{t: 18, sent: 9, latest: 10}), []gap{{10, 18}}},
		{"the first two ends set the mean", 0,
			[]end{{t: 1, sent: 0, latest: 1}, {t: 100, sent: 0, latest: 1}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st stalls
			st.quiet = tc.quiet * ms
			for _, e := range tc.ends {
				st.ended(e.t*ms, e.sent*ms, e.latest*ms, func() bool { return e.inFlight })
			}
			var got []gap
			for _, g := range st.gaps {
				if g != (gap{}) {
					got = append(got, gap{g.from / ms, g.to / ms})
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("gaps %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStallsMeanLeavesAStallOut(t *testing.T) {
	var st stalls
	for i := int64(1); i <= 10; i++ {
		st.ended(i*ms, (i-1)*ms, i*ms, func() bool { return false })
	}
	st.ended(1000*ms, 9*ms, 10*ms, func() bool { return false }) // a 990 ms stall
	// The stretch counts at most stallGaps × the mean: 1 + (8−1)/16 ms.
	if want := float64(ms) * (1 + 7.0/meanWindow); st.meanGap != want {
		t.Errorf("mean %v ns, want %v", st.meanGap, want)
	}
}

func TestStallsNet(t *testing.T) {
	var st stalls
	st.gap(10*ms, 20*ms)
	st.gap(30*ms, 32*ms)
	for _, tc := range []struct {
		at, took, want int64 // ms
	}{
		{25, 20, 10}, // from 5: the whole first gap
		{25, 10, 5},  // from 15: half of it
		{9, 5, 5},    // before both
		{40, 40, 28}, // from 0: both
		{31, 2, 1},   // from 29: 1 ms of the second
		{15, 1, 0},   // within a gap: nothing left
	} {
		if got := st.net(tc.at*ms, float64(tc.took*ms)); got != float64(tc.want*ms) {
			t.Errorf("net(%d ms, %d ms) = %v ms, want %d", tc.at, tc.took, got/float64(ms), tc.want)
		}
	}
}

func TestStallsNetOnceTheRingHasTurned(t *testing.T) {
	var st stalls
	for i := range int64(gapRing + 1) {
		st.gap(100*ms+i*10*ms, 100*ms+i*10*ms+ms)
	}
	// The oldest gap remembered, [110, 111], ends after the answer began:
	// the gaps before it, forgotten, may have been within it too.
	if got := st.net(300*ms, float64(200*ms)); got != float64(200*ms) {
		t.Errorf("net = %v ms, want 200 as it is", got/float64(ms))
	}
	// An answer that began after the oldest remembered gap is netted.
	if got := st.net(300*ms, float64(100*ms)); got != float64(100*ms-gapRing*ms+9*ms) {
		t.Errorf("net = %v ms", got/float64(ms))
	}
}
