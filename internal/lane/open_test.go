package lane

import (
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

func TestOpenIsALaneNeitherUsedNorBlocked(t *testing.T) {
	s := newSet(policy.Replicas{Connections: 3, ConsecutiveFailures: -1})
	now := t0
	for range 30 { // every lane answers, so that a hold has others left
		l := s.Take(now, 0)
		s.Done(l, now, time.Millisecond, policy.Success, 0)
	}
	// Lane 2 is held by a Retry-After of 2 s.
	held := s.Take(now, 0b011)
	if held.Index != 2 {
		t.Fatalf("Take with lanes 0 and 1 used picked lane %d, want 2", held.Index)
	}
	if rep := s.Done(held, now, time.Millisecond, policy.Failure, 2*time.Second); !rep.Held {
		t.Fatal("a 503's Retry-After did not hold its lane")
	}
	for _, step := range []struct {
		at   time.Duration
		used uint64
		want bool
	}{
		{0, 0, true},      // lanes 0 and 1
		{0, 0b001, true},  // lane 1
		{0, 0b011, false}, // lane 2 is held
		{0, 0b111, false}, // every lane used
		{0, 0b110, true},  // lane 0
		{time.Second, 0b011, false},
		{2 * time.Second, 0b011, true}, // the hold is over
		{3 * time.Second, 0b111, false},
	} {
		if got := s.Open(now.Add(step.at), step.used); got != step.want {
			t.Errorf("Open(t0+%v, %03b) = %v, want %v", step.at, step.used, got, step.want)
		}
	}
	if c := s.Counts(now); c.InFlight != 0 {
		t.Errorf("Open changed the in-flight count: %d", c.InFlight)
	}
}

func TestOpenAllocatesNothing(t *testing.T) {
	s := newSet(policy.Replicas{})
	if n := testing.AllocsPerRun(100, func() { s.Open(t0, 0b1) }); n != 0 {
		t.Errorf("Open allocated %v times, want 0", n)
	}
}
