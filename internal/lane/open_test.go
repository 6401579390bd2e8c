package lane

import (
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

func TestOpenInIsWhenALaneNeitherUsedNorBlockedIs(t *testing.T) {
	s := newSet(policy.Replicas{Connections: 3})
	// Lane 1 is blocked until t0+1s, lane 2 until t0+2s, as a hold or an
	// ejection leaves them.
	v := s.view.Load()
	v.lanes[1].until.Store(s.nanos(t0.Add(time.Second)))
	v.lanes[2].until.Store(s.nanos(t0.Add(2 * time.Second)))
	for _, step := range []struct {
		at   time.Duration
		used uint64
		wait time.Duration
		ok   bool
	}{
		{0, 0, 0, true},                   // lane 0
		{0, 0b001, time.Second, true},     // lane 1, in 1s
		{0, 0b011, 2 * time.Second, true}, // lane 2, in 2s
		{0, 0b111, 0, false},              // every lane used
		{0, 0b110, 0, true},               // lane 0
		{500 * time.Millisecond, 0b001, 500 * time.Millisecond, true},
		{time.Second, 0b001, 0, true}, // lane 1's block is over
		{1500 * time.Millisecond, 0b011, 500 * time.Millisecond, true},
		{3 * time.Second, 0b011, 0, true},
		{3 * time.Second, 0b111, 0, false},
	} {
		wait, ok := s.OpenIn(t0.Add(step.at), step.used)
		if wait != step.wait || ok != step.ok {
			t.Errorf("OpenIn(t0+%v, %03b) = %v, %v; want %v, %v", step.at, step.used, wait, ok, step.wait, step.ok)
		}
	}
	if c := s.Counts(t0); c.InFlight != 0 || c.Ejected != 0 {
		t.Errorf("OpenIn changed the set: %+v", c)
	}
}

func TestOpenInAllocatesNothing(t *testing.T) {
	s := newSet(policy.Replicas{})
	if n := testing.AllocsPerRun(100, func() { s.OpenIn(t0, 0b1) }); n != 0 {
		t.Errorf("OpenIn allocated %v times, want 0", n)
	}
}
