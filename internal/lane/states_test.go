package lane

import (
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestStates steps four connection lanes through every state: probing
// before an answer, open after one, held by a Retry-After, down after a
// refused dial, ejected after ConsecutiveFailures, and probing again as
// each block ends.
func TestStates(t *testing.T) {
	s := newSet(policy.Replicas{ConsecutiveFailures: 2})
	lanes := map[int]*Lane[pool]{}
	for len(lanes) < 4 {
		l := s.Take(t0, 0)
		lanes[l.Index] = l
	}
	const (
		open, probing, held, down, ejected = policy.LaneOpen, policy.LaneProbing, policy.LaneHeld, policy.LaneDown, policy.LaneEjected
	)
	type lanes4 = [4]policy.LaneState
	check := func(at time.Duration, want lanes4) {
		t.Helper()
		var got [policy.MaxLanes]policy.LaneSnapshot
		got[10].State = open // overwritten: no lane at 10
		s.States(t0.Add(at), &got)
		for i, g := range got {
			var w policy.LaneState
			if i < len(want) {
				w = want[i]
			}
			if g.State != w || g.Addr != "" {
				t.Errorf("at %v, lane %d: %v %q, want %v", at, i, g.State, g.Addr, w)
			}
		}
	}
	check(0, lanes4{probing, probing, probing, probing})
	for _, l := range lanes {
		s.Done(l, t0, 5*time.Millisecond, policy.Success, Answer{})
	}
	check(0, lanes4{open, open, open, open})

	// at sends an attempt on lane i, all others marked used, and ends it
	// at d with o and a.
	at := func(d time.Duration, i int, o policy.Outcome, a Answer) {
		t.Helper()
		if l := s.Take(t0.Add(d), ^uint64(0)&^(1<<i)); l != lanes[i] {
			t.Fatalf("took lane %d, want %d", l.Index, i)
		}
		s.Done(lanes[i], t0.Add(d), 5*time.Millisecond, o, a)
	}
	at(time.Millisecond, 1, policy.Failure, Answer{Hold: 10 * time.Second})
	at(time.Millisecond, 2, policy.Failure, Answer{Kind: Unreached})
	at(time.Millisecond, 3, policy.Failure, Answer{})
	check(time.Millisecond, lanes4{open, held, down, open})
	at(2*time.Millisecond, 3, policy.Failure, Answer{})
	check(2*time.Millisecond, lanes4{open, held, down, ejected})
	check(2*time.Second, lanes4{open, held, probing, ejected})
	check(10*time.Second, lanes4{open, probing, probing, ejected})
	check(31*time.Second, lanes4{open, probing, probing, probing})
}

// TestStatesOfEndpoints: the lanes of Endpoints' answer at their indexes,
// with their addresses.
func TestStatesOfEndpoints(t *testing.T) {
	s := newSet(policy.Replicas{Endpoints: stub{}})
	var got [policy.MaxLanes]policy.LaneSnapshot
	s.States(t0, &got)
	if got[0] != (policy.LaneSnapshot{State: policy.LaneProbing}) || got[1] != (policy.LaneSnapshot{}) {
		t.Errorf("before Endpoints answers: %+v, want the request's own address probing", got[:2])
	}
	s.StartRefresh(t0)
	s.Update(t0, []string{"a:80", "b:80", "c:80"}, nil)
	s.States(t0, &got)
	addrs := map[string]bool{}
	n := 0
	for _, l := range got {
		if l.State == 0 {
			continue
		}
		n++
		addrs[l.Addr] = true
		if l.State != policy.LaneProbing {
			t.Errorf("%s: %v, want probing", l.Addr, l.State)
		}
	}
	if n != 3 || !addrs["a:80"] || !addrs["b:80"] || !addrs["c:80"] {
		t.Errorf("after the answer: %d lanes %v, want a:80, b:80 and c:80", n, addrs)
	}
}

func TestStatesAllocatesNothing(t *testing.T) {
	s := newSet(policy.Replicas{})
	var got [policy.MaxLanes]policy.LaneSnapshot
	if n := testing.AllocsPerRun(100, func() { s.States(t0, &got) }); n != 0 {
		t.Errorf("States allocates %v times, want 0", n)
	}
}
