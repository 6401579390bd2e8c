package lane

import (
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

func TestOpenIsALaneNeitherUsedNorBlocked(t *testing.T) {
	s := newSet(policy.Replicas{Connections: 3})
	// Lane 2 is blocked until t0+2s, as a hold or an ejection leaves it.
	s.view.Load().lanes[2].until.Store(s.nanos(t0.Add(2 * time.Second)))
	for _, step := range []struct {
		at   time.Duration
		used uint64
		want bool
	}{
		{0, 0, true},      // lanes 0 and 1
		{0, 0b001, true},  // lane 1
		{0, 0b011, false}, // lane 2 is blocked
		{0, 0b111, false}, // every lane used
		{0, 0b110, true},  // lane 0
		{time.Second, 0b011, false},
		{2 * time.Second, 0b011, true}, // the block is over
		{3 * time.Second, 0b111, false},
	} {
		if got := s.Open(t0.Add(step.at), step.used); got != step.want {
			t.Errorf("Open(t0+%v, %03b) = %v, want %v", step.at, step.used, got, step.want)
		}
	}
	if c := s.Counts(t0); c.InFlight != 0 || c.Ejected != 0 {
		t.Errorf("Open changed the set: %+v", c)
	}
}

func TestOpenAllocatesNothing(t *testing.T) {
	s := newSet(policy.Replicas{})
	if n := testing.AllocsPerRun(100, func() { s.Open(t0, 0b1) }); n != 0 {
		t.Errorf("Open allocated %v times, want 0", n)
	}
}
