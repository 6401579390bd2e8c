package lane

import (
	"testing"

	"github.com/resilix/resilix/policy"
)

// TestBlockTransitions walks the block table of health.go.
func TestBlockTransitions(t *testing.T) {
	var l Lane[pool]
	step := func(b block, u int64, did bool, want block, until int64) {
		t.Helper()
		if got := l.blockLocked(b, u); got != did || l.block != want || l.until.Load() != until {
			t.Errorf("blockLocked(%d, %d) = %v, block %d until %d; want %v, %d until %d",
				b, u, got, l.block, l.until.Load(), did, want, until)
		}
	}
	step(held, 10, true, held, 10)
	step(down, 5, false, held, 10) // ends sooner: the hold stands
	step(down, 20, true, down, 20)
	l.block = ejected
	step(held, 30, true, ejected, 30) // an ejection stays one, for the later end
	step(down, 25, false, ejected, 30)
	if !l.ejectedAt(29) || l.ejectedAt(30) {
		t.Errorf("ejectedAt(29), ejectedAt(30) = %v, %v; want true, false", l.ejectedAt(29), l.ejectedAt(30))
	}
}

// TestHealthTransitions walks the health table of health.go.
func TestHealthTransitions(t *testing.T) {
	var l Lane[pool]
	for _, tc := range []struct {
		from health
		fail bool // a Failure, else a Success
		want health
	}{
		{unknown, true, failing},
		{answering, true, failing},
		{failing, true, failing},
		{out, true, out},
		{unknown, false, answering},
		{failing, false, answering},
		{out, false, answering},
	} {
		l.health = tc.from
		if tc.fail {
			l.failed()
		} else {
			s := newSet(policy.Replicas{})
			s.successLocked(&l, 1, 0, false, &Report[pool]{})
		}
		if l.health != tc.want {
			t.Errorf("%d, then a failure %v: %d, want %d", tc.from, tc.fail, l.health, tc.want)
		}
	}
}
