package lane

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

// sim is a key's traffic over a Set in virtual time, one step a
// millisecond: calls arrive open loop, each is sent on the lane Take
// picks, and its answer comes back after what serve says. While the
// client is paused, nothing runs: answers due then are read at the
// pause's end, and the calls that should have arrived arrive then, at
// once.
type sim struct {
	s     *Set[pool]
	now   time.Time
	every time.Duration // between calls
	// serve says how an attempt sent on l at now goes: its latency to
	// headers (or error), its outcome and what it told of the lane.
	serve func(l *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer)
	// paused reports whether the client is paused at now.
	paused func(now time.Time) bool

	next     time.Time // the next call's arrival
	inflight []flight
	ejected  []Ejection[pool]
	hits     map[string]int // address or index → attempts sent, this window
}

type flight struct {
	l    *Lane[pool]
	sent time.Time
	due  time.Time
	o    policy.Outcome
	a    Answer
}

func newSim(s *Set[pool], every time.Duration, serve func(*Lane[pool], time.Time) (time.Duration, policy.Outcome, Answer)) *sim {
	return &sim{s: s, now: t0, next: t0, every: every, serve: serve, paused: func(time.Time) bool { return false }, hits: map[string]int{}}
}

func name(l *Lane[pool]) string { return policy.LaneName(l.Addr, l.Index) }

// run advances the simulation by d.
func (m *sim) run(d time.Duration) {
	for end := m.now.Add(d); m.now.Before(end); {
		m.now = m.now.Add(time.Millisecond)
		if m.paused(m.now) {
			continue
		}
		// Answers first, in the order they came back.
		slices.SortFunc(m.inflight, func(a, b flight) int { return a.due.Compare(b.due) })
		k := 0
		for _, f := range m.inflight {
			if f.due.After(m.now) {
				m.inflight[k] = f
				k++
				continue
			}
			m.ejected = append(m.ejected, m.s.Done(f.l, m.now, m.now.Sub(f.sent), f.o, f.a).Ejected...)
		}
		m.inflight = m.inflight[:k]
		for ; !m.next.After(m.now); m.next = m.next.Add(m.every) {
			l := m.s.Take(m.now, 0)
			m.hits[name(l)]++
			lat, o, a := m.serve(l, m.now)
			m.inflight = append(m.inflight, flight{l: l, sent: m.now, due: m.now.Add(lat), o: o, a: a})
		}
	}
}

// window runs d and returns each lane's share of the attempts sent in it.
func (m *sim) window(d time.Duration) map[string]float64 {
	clear(m.hits)
	m.run(d)
	n := 0
	for _, h := range m.hits {
		n += h
	}
	share := map[string]float64{}
	for k, h := range m.hits {
		share[k] = float64(h) / float64(n)
	}
	return share
}

func addrSet(t *testing.T, cfg policy.Replicas, addrs ...string) *Set[pool] {
	t.Helper()
	cfg.Endpoints = stub{}
	s := newSet(cfg)
	if !s.StartRefresh(t0) {
		t.Fatal("no refresh due at the start")
	}
	s.Update(t0, addrs, nil)
	return s
}

func healthy(time.Duration) func(*Lane[pool], time.Time) (time.Duration, policy.Outcome, Answer) {
	return func(*Lane[pool], time.Time) (time.Duration, policy.Outcome, Answer) {
		return 5 * time.Millisecond, policy.Success, Answer{}
	}
}

func TestALaneAddedByARefreshGetsOneProbeAtATime(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	for i := range 300 { // known lanes, answering in 5ms
		now := t0.Add(time.Duration(i) * time.Millisecond)
		s.Done(s.Take(now, 0), now, 5*time.Millisecond, policy.Success, Answer{})
	}
	now := t0.Add(time.Second)
	s.refreshAt.Store(0)
	s.StartRefresh(now)
	s.Update(now, []string{"a", "b", "c", "d"}, nil)
	// 16 callers at once, none answered yet.
	on := 0
	for range 16 {
		if l := s.Take(now, 0); l.Addr == "d" {
			on++
		}
	}
	if on != 1 {
		t.Errorf("16 callers put %d attempts on the new lane before its first answer, want 1", on)
	}
}

func TestASetShrunkToEjectedLanes(t *testing.T) {
	// Four dead replicas, two of them ejected; then Endpoints answers
	// only those two.
	s := addrSet(t, policy.Replicas{}, "a", "b", "c", "d")
	now := t0
	for range 200 {
		now = now.Add(time.Millisecond)
		s.Done(s.Take(now, 0), now, time.Millisecond, policy.Failure, Answer{})
	}
	var ejected []string
	v := s.view.Load()
	for m := v.mask; m != 0; m &= m - 1 {
		if l := v.lanes[trailing(m)]; l.ejectedAt(s.nanos(now)) {
			ejected = append(ejected, l.Addr)
		}
	}
	if len(ejected) != 2 {
		t.Fatalf("ejected %q, want two of four", ejected)
	}
	s.refreshAt.Store(0)
	s.StartRefresh(now)
	s.Update(now, ejected, nil)
	if c := s.Counts(now); c.Ejected != 1 {
		t.Errorf("2 lanes left, %d ejected, want 1 (MaxEjected holds on the new set)", c.Ejected)
	}
	unexplained := 0
	for range 100 {
		now = now.Add(time.Millisecond)
		l := s.Take(now, 0)
		if !s.Done(l, now, time.Millisecond, policy.Failure, Answer{}).Explained {
			unexplained++
		}
	}
	if unexplained < 90 {
		t.Errorf("%d of 100 failures reach the key's breaker with no lane left to explain them, want at least 90", unexplained)
	}
}

func TestTheLongestEjectedReturnFirstWhenTheSetShrinks(t *testing.T) {
	s := addrSet(t, policy.Replicas{MaxEjected: 1}, "a", "b", "c", "d", "e")
	now := t0
	fail := func(addr string) {
		for range 5 {
			now = now.Add(time.Millisecond)
			var used uint64
			v := s.view.Load()
			for m := v.mask; m != 0; m &= m - 1 {
				if l := v.lanes[trailing(m)]; l.Addr != addr {
					used |= 1 << l.Index
				}
			}
			l := s.Take(now, used)
			if l.Addr != addr {
				t.Fatalf("took %s, want %s", l.Addr, addr)
			}
			s.Done(l, now, time.Millisecond, policy.Failure, Answer{})
		}
	}
	for _, a := range []string{"b", "c", "d"} {
		fail(a)
		now = now.Add(time.Second)
	}
	s.refreshAt.Store(0)
	s.StartRefresh(now)
	s.Update(now, []string{"b", "c", "d"}, nil) // two may be ejected of three
	var still []string
	v := s.view.Load()
	for m := v.mask; m != 0; m &= m - 1 {
		if l := v.lanes[trailing(m)]; l.ejectedAt(s.nanos(now)) {
			still = append(still, l.Addr)
		}
	}
	if fmt.Sprint(still) != "[c d]" {
		t.Errorf("ejected after the set shrank: %q, want [c d] (b, the longest ejected, back)", still)
	}
}

func TestEveryLaneSlowTogetherEjectsNone(t *testing.T) {
	// The client's own process is paused 200ms of every 500ms: every
	// answer that straddles a pause is read 200ms late, and the calls
	// that should have arrived meanwhile go out at once, on every lane
	// alike.
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	paused := func(now time.Time) bool { return now.Sub(t0)%(500*time.Millisecond) >= 300*time.Millisecond }
	var free time.Time
	serve := func(_ *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer) {
		// The client reads each answer in turn, 2ms each, 3ms after
		// its server answers: the calls of the burst at a pause's end
		// queue behind each other, in the order they were sent.
		free = later(free, now).Add(2 * time.Millisecond)
		return 3*time.Millisecond + free.Sub(now), policy.Success, Answer{}
	}
	m := newSim(s, 5*time.Millisecond, serve)
	m.run(2 * time.Second) // warm, unpaused
	m.paused = paused
	shares := m.window(10 * time.Second)
	if len(m.ejected) != 0 {
		t.Errorf("ejected %v with every lane slow together", m.ejected)
	}
	for _, a := range []string{"a", "b", "c"} {
		if shares[a] < 1.0/3/2 {
			t.Errorf("lane %s got %.1f%% of the calls while the client stalled, want at least half its fair share (%v)", a, 100*shares[a], shares)
		}
	}
}

// warmLanes sends n attempts one after another on s, each answered after
// d, from now, and returns the time the last came back.
func warmLanes(s *Set[pool], now time.Time, n int, d time.Duration) time.Time {
	for range n {
		l := s.Take(now, 0)
		now = now.Add(d)
		s.Done(l, now, d, policy.Success, Answer{})
	}
	return now
}

// maxEstimate returns the largest latency estimate of s's lanes at now.
func maxEstimate(s *Set[pool], now time.Time) time.Duration {
	t := s.nanos(now)
	v := s.view.Load()
	e := 0.0
	for m := v.mask; m != 0; m &= m - 1 {
		e = max(e, v.lanes[trailing(m)].estimate(t))
	}
	return time.Duration(e)
}

// TestAStallTheOnlyAnswerStraddledIsNetted: a stall of the client's own
// process through which one attempt alone was in flight is a stall all
// the same: the answer that straddled it is sampled net of it, and no
// lane's estimate jumps to it (a peak of 205ms would keep that lane from
// being picked for as long as the estimate takes to decay, tens of
// seconds). The attempt that ended was not counted as in flight.
func TestAStallTheOnlyAnswerStraddledIsNetted(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	now := warmLanes(s, t0, 400, 5*time.Millisecond)
	l := s.Take(now, 0)
	now = now.Add(205 * time.Millisecond) // 5ms of service, 200ms stalled
	s.Done(l, now, 205*time.Millisecond, policy.Success, Answer{})
	if e := maxEstimate(s, now); e > 10*time.Millisecond {
		t.Errorf("a lane's estimate is %v after a 200ms stall of the client, want it near the 5ms its replicas take", e)
	}
}

// TestAStallAfterTheLastEndIsNetted: the attempt a stall caught alone was
// sent a moment after the key's last end, so no attempt was in flight
// from that end; but nothing was sent or ended after it either, for 200ms
// of a key that sends one every 5ms: the stretch from its sending is the
// stall. After the stall, its answer is read and the next call is sent at
// about the same moment, in either order. No lane's estimate takes the
// stall as a peak (fleetops' stall scenario: the lane that got such an
// answer had none of the calls for the 8s that followed).
func TestAStallAfterTheLastEndIsNetted(t *testing.T) {
	for _, takeFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("the next call taken first: ", takeFirst), func(t *testing.T) {
			s := addrSet(t, policy.Replicas{}, "a", "b", "c")
			now := warmLanes(s, t0, 400, 5*time.Millisecond)
			sent := now.Add(100 * time.Microsecond)
			l := s.Take(sent, 0)
			answered := sent.Add(205 * time.Millisecond) // 5ms of service, 200ms stalled
			var next *Lane[pool]
			if takeFirst {
				next = s.Take(answered.Add(100*time.Microsecond), 0)
			}
			s.Done(l, answered, 205*time.Millisecond, policy.Success, Answer{})
			if !takeFirst {
				next = s.Take(answered.Add(100*time.Microsecond), 0)
			}
			s.Done(next, answered.Add(5*time.Millisecond), 5*time.Millisecond, policy.Success, Answer{})
			if e := maxEstimate(s, answered.Add(5*time.Millisecond)); e > 10*time.Millisecond {
				t.Errorf("a lane's estimate is %v after a 200ms stall of the client, want it near the 5ms its replicas take", e)
			}
		})
	}
}

// TestAFrozenReplicaIsProbedAndAnswersAtItsThaw: a replica frozen for 5 s
// (its kernel still accepts; nothing answers) fails each attempt at the
// attempt's timeout, 1 s, with no answer, and answers at its thaw what it
// took since. Such a lane is out for a second at each, then gets one probe
// at a time: it takes an attempt about every 2 s while frozen, and
// answers within about a second of its thaw (the probe in flight then, or
// the next, when the last timed out just before). That first answer took
// as long as the freeze kept it, and is taken as no slower than the other
// lanes: the lane has half its fair share 1 to 4 s after its thaw. Were
// that answer taken as a peak of up to a second, the lane would be left
// unpicked for seconds after the thaw, as it would with a failure penalty
// of 2^k × its 1 s answer, fading with a 1 s time constant.
func TestAFrozenReplicaIsProbedAndAnswersAtItsThaw(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	from, to := t0.Add(2*time.Second), t0.Add(7*time.Second)
	var answered time.Time // lane a's first answer after its thaw
	serve := func(l *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer) {
		if l.Addr != "a" || now.Before(from) {
			return 5 * time.Millisecond, policy.Success, Answer{}
		}
		d := 5 * time.Millisecond
		if now.Before(to) {
			if d = to.Sub(now) + d; d >= time.Second {
				return time.Second, policy.Failure, Answer{Kind: Mute}
			}
		}
		if answered.IsZero() {
			answered = now.Add(d)
		}
		return d, policy.Success, Answer{}
	}
	checkThaw(t, newSim(s, 5*time.Millisecond, serve), 5, "one about every 2 s", to, &answered)
}

// checkThaw runs m, whose lane a is frozen from 2 s to thaw at 7 s (the
// serve func sets answered at a's first answer after it), and checks that
// a took at most most attempts while frozen, answered within 1.5 s of its
// thaw, had half its fair share 1 to 4 s after, and that nothing was
// ejected.
func checkThaw(t *testing.T, m *sim, most float64, want string, thaw time.Time, answered *time.Time) {
	t.Helper()
	m.run(2 * time.Second)
	frozen := m.window(5 * time.Second)
	if n := frozen["a"] * float64(5*time.Second/m.every); n > most {
		t.Errorf("%.0f attempts on the frozen lane in its 5 s, want %s", n, want)
	}
	m.run(time.Second)
	back := m.window(3 * time.Second)
	t.Logf("%.0f attempts on lane a while frozen; its first answer %v after its thaw; shares 1 to 4 s after %v",
		frozen["a"]*float64(5*time.Second/m.every), answered.Sub(thaw), back)
	if answered.IsZero() || answered.Sub(thaw) > 1500*time.Millisecond {
		t.Errorf("lane a answered %v after its thaw, want within 1.5 s (zero: never)", answered.Sub(thaw))
	}
	if back["a"] < 1.0/3/2 {
		t.Errorf("lane a got %.1f%% of the calls 1 to 4 s after its thaw, want at least half its fair share (%v)", 100*back["a"], back)
	}
	if len(m.ejected) != 0 {
		t.Errorf("ejected %v", m.ejected)
	}
}

// TestABacklogAfterAStallMovesNoTraffic: the calls a stall held back go
// out together and come back slowed in the order they were sent, none
// overtaking another (the client works through them): every lane slow
// together, so no lane's estimate takes the peak of such an answer.
func TestABacklogAfterAStallMovesNoTraffic(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	now := warmLanes(s, t0, 400, 5*time.Millisecond)
	var burst []*Lane[pool]
	for range 30 {
		burst = append(burst, s.Take(now, 0))
	}
	for k, l := range burst {
		d := 5*time.Millisecond + time.Duration(k)*time.Millisecond
		s.Done(l, now.Add(d), d, policy.Success, Answer{})
	}
	if e := maxEstimate(s, now.Add(35*time.Millisecond)); e > 10*time.Millisecond {
		t.Errorf("a lane's estimate is %v after a backlog of 30 calls answered in the order sent, want it near the 5ms its replicas take", e)
	}
}

// TestABacklogAnsweredOutOfOrderMovesNoTraffic: the calls a stall held
// back go out within a millisecond of each other and come back in no
// particular order, some quick, some slowed by the client working through
// the rest; a quick one sent a moment after a slow one is no evidence
// that the slow one's lane is slow, since it was not sent after the slow
// one by as much as it took. No lane's estimate takes such a peak.
func TestABacklogAnsweredOutOfOrderMovesNoTraffic(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	now := warmLanes(s, t0, 400, 5*time.Millisecond)
	type call struct {
		l        *Lane[pool]
		sent     time.Time
		took     time.Duration
		answered time.Time
	}
	var burst []call
	for k := range 30 {
		sent := now.Add(time.Duration(k) * 50 * time.Microsecond)
		took := 3 * time.Millisecond
		if k%2 == 0 {
			took = 5*time.Millisecond + time.Duration(k)*time.Millisecond
		}
		burst = append(burst, call{l: s.Take(sent, 0), sent: sent, took: took, answered: sent.Add(took)})
	}
	slices.SortFunc(burst, func(a, b call) int { return a.answered.Compare(b.answered) })
	for _, c := range burst {
		s.Done(c.l, c.answered, c.took, policy.Success, Answer{})
	}
	if e := maxEstimate(s, now.Add(40*time.Millisecond)); e > 10*time.Millisecond {
		t.Errorf("a lane's estimate is %v after a backlog of 30 calls answered out of order, want it near the 5ms its replicas take", e)
	}
}

func TestOneLane20xSlowerIsStillEjected(t *testing.T) {
	for _, every := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(fmt.Sprint(int(time.Second/every), " calls a second"), func(t *testing.T) {
			s := addrSet(t, policy.Replicas{}, "a", "b", "c", "d")
			serve := func(l *Lane[pool], _ time.Time) (time.Duration, policy.Outcome, Answer) {
				if l.Addr == "d" {
					return 100 * time.Millisecond, policy.Success, Answer{}
				}
				return 5 * time.Millisecond, policy.Success, Answer{}
			}
			m := newSim(s, every, serve)
			m.run(time.Second)
			shares := m.window(10 * time.Second)
			for _, e := range m.ejected {
				if e.Lane.Addr != "d" || e.Reason != policy.EjectLatency {
					t.Errorf("ejected %s for %v, want only d for its latency", e.Lane.Addr, e.Reason)
				}
			}
			if shares["d"] > 0.02 {
				t.Errorf("the 20x slower lane got %.1f%% of the calls, want at most 2%%", 100*shares["d"])
			}
		})
	}
}

// TestAReplicaSlowOnlyForItsQueueIsOutForAMoment: an address lane slow
// only while its replica's queue lasts (its workers cut for a moment
// while every client sends to it, as in make fleet-pushback) is taken out
// and probed, and has its share back once a probe answers fast; ejected
// for EjectFor at its first slow run, as every client would eject it at
// once, the replica would be out of the fleet for 30s, and the replicas
// left would refuse what it served. Here its slowness outlasts its first
// out, as long as its answers took, and its second, of downFor, ends it.
// A replica still slow when probed is ejected at its third slow run.
func TestAReplicaSlowOnlyForItsQueueIsOutForAMoment(t *testing.T) {
	for _, tt := range []struct {
		name   string
		slowTo time.Duration // d answers in 40ms until then, then in 2ms
		eject  bool
	}{
		{"its queue", 200 * time.Millisecond, false},
		{"slow when probed", 3 * time.Second, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := addrSet(t, policy.Replicas{}, "a", "b", "c", "d")
			now := t0
			var ejected []Ejection[pool]
			var states [policy.MaxLanes]policy.LaneSnapshot
			var outAt time.Time
			picked := 0 // of d, in the last second
			for k := range 3000 {
				now = now.Add(time.Millisecond)
				// Each lane in turn, as the calls of the other
				// clients of the fleet would be.
				l := s.Take(now, 0b1111&^(1<<(k%4)))
				lat := 2 * time.Millisecond
				if l.Addr == "d" && now.Before(t0.Add(tt.slowTo)) {
					lat = 40 * time.Millisecond
				}
				if l.Addr == "d" && now.After(t0.Add(2*time.Second)) {
					picked++
				}
				ejected = append(ejected, s.Done(l, now, lat, policy.Success, Answer{}).Ejected...)
				if s.States(now, &states); outAt.IsZero() && states[l.Index].Addr == "d" && states[l.Index].State == policy.LaneDown {
					outAt = now
				}
			}
			switch {
			case outAt.IsZero():
				t.Error("d never taken out, want out at its first slow run")
			case outAt.Sub(t0) > 200*time.Millisecond:
				t.Errorf("d taken out at %v, want at its first slow run, in the first 200ms", outAt.Sub(t0))
			}
			if !tt.eject {
				if len(ejected) != 0 {
					t.Errorf("ejected %+v, want none: d was slow only for its queue", ejected)
				}
				// Over the last second, a quarter of 1000 picks
				// turn to d.
				if picked < 200 {
					t.Errorf("d had %d of about 250 picks in the last second, want its share back", picked)
				}
				return
			}
			if len(ejected) != 1 || ejected[0].Lane.Addr != "d" || ejected[0].Reason != policy.EjectLatency {
				t.Errorf("ejected %+v, want d for its latency, once", ejected)
			}
		})
	}
}

// TestAReplicaOutForItsQueueIsOutAboutAsLongAsItsAnswersTook: a slow run
// takes an address lane out for as long as the run's last answer took
// (at most downFor), about how long its replica's queue takes to drain
// once the clients send elsewhere; then it is probed. Every client sees
// the same queue and takes the replica out at once, and in a fleet with
// no capacity to spare, as make fleet-pushback's in its fourth replica's
// dip, each moment the replica stays out after its queue drained is
// capacity the replicas left refuse calls for.
func TestAReplicaOutForItsQueueIsOutAboutAsLongAsItsAnswersTook(t *testing.T) {
	const queued = 40 * time.Millisecond // d's answers while its queue lasts
	s := addrSet(t, policy.Replicas{}, "a", "b", "c", "d")
	now := t0
	var states [policy.MaxLanes]policy.LaneSnapshot
	var outAt, backAt time.Time
	for k := range 2000 {
		now = now.Add(time.Millisecond)
		// Each lane in turn, as the calls of the other clients of
		// the fleet would be.
		l := s.Take(now, 0b1111&^(1<<(k%4)))
		lat := 2 * time.Millisecond
		if l.Addr == "d" && outAt.IsZero() {
			lat = queued
		}
		if l.Addr == "d" && !outAt.IsZero() && backAt.IsZero() {
			backAt = now
		}
		s.Done(l, now, lat, policy.Success, Answer{})
		if s.States(now, &states); outAt.IsZero() && states[l.Index].Addr == "d" && states[l.Index].State == policy.LaneDown {
			outAt = now
		}
	}
	switch {
	case outAt.IsZero():
		t.Fatal("d never taken out, want out at its slow run")
	case backAt.IsZero():
		t.Fatalf("d taken out at %v and never picked again", outAt.Sub(t0))
	case backAt.Sub(outAt) > 2*queued:
		t.Errorf("d picked again %v after its out, want within %v: its answers took %v", backAt.Sub(outAt), 2*queued, queued)
	}
}

// TestAReplicasQueueInFlightIsOneSlowRun: the answers of a burst sent to
// a replica at once come back slow one after the other, its queue; those
// after the first slowRun, sent before its out ended, make no second run.
func TestAReplicasQueueInFlightIsOneSlowRun(t *testing.T) {
	s := addrSet(t, policy.Replicas{}, "a", "b", "c", "d")
	now := t0
	var d *Lane[pool]
	for k := range 400 { // every lane answers in 2ms
		now = now.Add(time.Millisecond)
		l := s.Take(now, 0b1111&^(1<<(k%4)))
		if l.Addr == "d" {
			d = l
		}
		s.Done(l, now, 2*time.Millisecond, policy.Success, Answer{})
	}
	dBit := uint64(1) << d.Index
	sent := now
	var burst []*Lane[pool]
	for range 3 * slowRun {
		if l := s.Take(sent, 0b1111&^dBit); l == d {
			burst = append(burst, l)
		}
	}
	if len(burst) < 2*slowRun {
		t.Fatalf("%d of the burst went to d, want at least %d", len(burst), 2*slowRun)
	}
	// The other lanes answer in 2ms, one a millisecond, while d's queue
	// answers its burst from 40ms on, one a millisecond.
	var ejected []Ejection[pool]
	for k := 1; k < 40+len(burst); k++ {
		now = sent.Add(time.Duration(k) * time.Millisecond)
		o := s.Take(now.Add(-2*time.Millisecond), dBit)
		s.Done(o, now, 2*time.Millisecond, policy.Success, Answer{})
		if i := k - 40; i >= 0 {
			ejected = append(ejected, s.Done(burst[i], now, now.Sub(sent), policy.Success, Answer{}).Ejected...)
		}
	}
	if len(ejected) != 0 {
		t.Errorf("ejected %+v, want none: %d answers of one queue", ejected, len(burst))
	}
	var states [policy.MaxLanes]policy.LaneSnapshot
	if s.States(now, &states); states[d.Index].State != policy.LaneDown {
		t.Errorf("d is %v, want down: out for its slow run", states[d.Index].State)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// trailing is bits.TrailingZeros64, for the tests' loops over a mask.
func trailing(m uint64) int {
	i := 0
	for m&1 == 0 {
		m >>= 1
		i++
	}
	return i
}

func TestARefusedDialTakesItsLaneOutAtOnce(t *testing.T) {
	s := addrSet(t, policy.Replicas{Refresh: 5 * time.Second}, "a", "b", "c")
	now := t0
	for range 30 {
		now = now.Add(time.Millisecond)
		s.Done(s.Take(now, 0), now, 5*time.Millisecond, policy.Success, Answer{})
	}
	c := s.view.Load().lanes[2]
	refused := func() Report[pool] {
		t.Helper()
		l := s.Take(now, 0b011)
		if l != c {
			t.Fatalf("took %s, want c", l.Addr)
		}
		return s.Done(l, now, time.Millisecond, policy.Failure, Answer{Kind: Unreached})
	}
	now = t0.Add(300 * time.Millisecond)
	if rep := refused(); !rep.Explained || len(rep.Ejected) != 0 {
		t.Errorf("a refused dial with two lanes open: %+v, want explained, and no ejection", rep)
	}
	for i := range 100 {
		at := now.Add(time.Duration(i) * 9 * time.Millisecond) // within 1s
		l := s.Take(at, 0)
		if l == c {
			t.Fatalf("c taken %v after its dial was refused", at.Sub(now))
		}
		s.Done(l, at, 5*time.Millisecond, policy.Success, Answer{})
	}
	// Endpoints is asked again early, but not twice within a second.
	if s.StartRefresh(t0.Add(999 * time.Millisecond)) {
		t.Error("a refresh started within 1s of the last")
	}
	if !s.StartRefresh(t0.Add(time.Second)) {
		t.Fatal("no refresh due 1s after the last, with a dial refused")
	}
	s.Update(t0.Add(time.Second), []string{"a", "b", "c"}, nil)
	// Refused again and again, for 10s: never ejected, probed each second.
	for range 10 {
		now = now.Add(time.Second)
		refused()
		if c := s.Counts(now); c.Ejected != 0 {
			t.Fatalf("%d lanes ejected by refused dials, want none", c.Ejected)
		}
	}
	// It listens again: within 1s one attempt, and one only, tries it.
	now = now.Add(time.Second)
	on := 0
	var held []*Lane[pool]
	for range 16 {
		l := s.Take(now, 0)
		if l == c {
			on++
		}
		held = append(held, l)
	}
	if on != 1 {
		t.Errorf("%d of 16 concurrent attempts on the lane 1s after its dial was refused, want 1", on)
	}
	for _, l := range held {
		s.Done(l, now, 5*time.Millisecond, policy.Success, Answer{})
	}

	t.Run("every lane refusing", func(t *testing.T) {
		s := addrSet(t, policy.Replicas{}, "a", "b")
		unexplained := 0
		for range 20 {
			if !s.Done(s.Take(t0, 0), t0, time.Millisecond, policy.Failure, Answer{Kind: Unreached}).Explained {
				unexplained++
			}
		}
		if unexplained < 19 {
			t.Errorf("%d of 20 refused dials reach the key's breaker with every lane refusing, want at least 19", unexplained)
		}
	})
}

// recovery is how long after a 2 s outage a lane is back to its share, as
// the failurePenalty doc states it.
const recovery = 3 * time.Second

func TestALanesShareAfterA2sOutage(t *testing.T) {
	// Three replicas at 200 calls/s; c's dials are refused from 2s to
	// 4s (a restart), then it answers as the others do.
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	down := func(now time.Time) bool { d := now.Sub(t0); return d >= 2*time.Second && d < 4*time.Second }
	serve := func(l *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer) {
		if l.Addr == "c" && down(now) {
			return time.Millisecond, policy.Failure, Answer{Kind: Unreached}
		}
		return 5 * time.Millisecond, policy.Success, Answer{}
	}
	m := newSim(s, 5*time.Millisecond, serve)
	m.run(4 * time.Second)
	m.run(recovery)
	share := m.window(time.Second)
	if share["c"] < 0.8/3 {
		t.Errorf("c got %.1f%% of the calls %v after a 2s outage, want at least 80%% of its fair share (%v)", 100*share["c"], recovery, share)
	}
	if len(m.ejected) != 0 {
		t.Errorf("ejected %v", m.ejected)
	}
}

// TestAFrozenReplicaWhoseLegsHedgesWinIsOutAndBackAtItsThaw: a replica
// frozen for 5 s whose every attempt is a hedged call's first leg: each
// is cancelled with no answer when the hedge on another lane wins, after
// the hedge's delay, 6 to 12 times the lanes' typical 5 ms (a busy
// client's threshold, or a heavy tail's), never at the attempt's
// timeout. Such losses are a slow run with no answer in it: the lane
// answers nothing while the others answer, and is out and then probed,
// not ejected for its latency (for EjectFor, 30 s: through its thaw). It
// answers within a second and a half of its thaw and has half its fair
// share 1 to 4 s after.
func TestAFrozenReplicaWhoseLegsHedgesWinIsOutAndBackAtItsThaw(t *testing.T) {
	frozenAndThawed(t, []time.Duration{31, 45, 33, 60, 38, 52, 30, 41}, 15, "a few, then one probe about every second")
}

// TestAFrozenReplicaWhoseLegsLoseAt3xIsProbedAndBackAtItsThaw: a replica
// frozen for 5 s whose every attempt is a hedged call's first leg lost,
// with no answer, after 13 to 18 ms, about 3 times the lanes' typical
// 5 ms: below the bar of a slow run (latencyFactor), so each loss is a
// sample of at least its time, and the first is taken as a peak. The
// lane is then the key's dearest, left unpicked by any pick that draws a
// cheaper lane beside it; but its high estimate is only what its
// silence said, and is stale a moment later: it is probed, one attempt
// at a time, about once a second, answers within 1.5 s of its thaw and
// has half its fair share 1 to 4 s after. Were the peak kept until it
// decays (10 s's time constant, from three times the others' latency),
// the thawed lane would get no call for seconds.
func TestAFrozenReplicaWhoseLegsLoseAt3xIsProbedAndBackAtItsThaw(t *testing.T) {
	frozenAndThawed(t, []time.Duration{15, 13, 17, 14, 18, 16, 13, 15}, 8, "about one probe a second")
}

// frozenAndThawed runs lanes a, b and c answering in 5 ms, but a from 2 s
// to 7 s: frozen, each attempt there a hedged call's first leg lost with
// no answer after the next of delays (in ms, in turn). It checks a's
// thaw (see checkThaw): at most probes attempts while frozen, as want
// says.
func frozenAndThawed(t *testing.T, delays []time.Duration, probes float64, want string) {
	t.Helper()
	s := addrSet(t, policy.Replicas{}, "a", "b", "c")
	from, to := t0.Add(2*time.Second), t0.Add(7*time.Second)
	k := 0
	var answered time.Time // lane a's first answer after its thaw
	serve := func(l *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer) {
		if l.Addr != "a" || now.Before(from) {
			return 5 * time.Millisecond, policy.Success, Answer{}
		}
		if now.Before(to) {
			k++
			return delays[k%len(delays)] * time.Millisecond, policy.Discarded, Answer{Kind: Silent}
		}
		if answered.IsZero() {
			answered = now.Add(5 * time.Millisecond)
		}
		return 5 * time.Millisecond, policy.Success, Answer{}
	}
	checkThaw(t, newSim(s, 5*time.Millisecond, serve), probes, want, to, &answered)
}

// TestASlowLaneWhoseLegsAllLoseToHedgesKeepsASmallShare: a replica 3
// times slower than the others whose every attempt is lost to a hedge
// with no answer, at 15 ms (below the slow run's bar), at 200, 20 and 5
// calls a second. Its estimate is what its silence said, and goes stale
// (see staleAfter): it is probed once a second or once in staleEnds + 1
// of the key's calls, whichever is rarer, each probe lost again, and
// keeps a small share: 0.5%, 0.5% and 1%.
func TestASlowLaneWhoseLegsAllLoseToHedgesKeepsASmallShare(t *testing.T) {
	for _, every := range []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond} {
		t.Run(fmt.Sprint(int(time.Second/every), " calls a second"), func(t *testing.T) {
			s := addrSet(t, policy.Replicas{}, "a", "b", "c")
			serve := func(l *Lane[pool], now time.Time) (time.Duration, policy.Outcome, Answer) {
				if l.Addr == "a" && now.After(t0.Add(time.Second)) {
					return 15 * time.Millisecond, policy.Discarded, Answer{Kind: Silent}
				}
				return 5 * time.Millisecond, policy.Success, Answer{}
			}
			m := newSim(s, every, serve)
			m.run(2 * time.Second)
			shares := m.window(20 * time.Second)
			t.Logf("shares %v", shares)
			// One probe per staleAfter, or per staleEnds + 1 calls when
			// that is longer, and some slack; a window of fewer calls
			// holds one probe.
			calls := float64(20*time.Second) / float64(every)
			most := 1.5 * max(min(float64(every)/float64(staleAfter), 1.0/(staleEnds+1)), 1/calls)
			if shares["a"] > most {
				t.Errorf("the slow lane got %.2f%% of the calls, want at most %.2f%% (%v)", 100*shares["a"], 100*most, shares)
			}
			if len(m.ejected) != 0 {
				t.Errorf("ejected %v", m.ejected)
			}
		})
	}
}

// TestOneCallAtATimeEjectsTheSlowLanesNotTheFast: a client that sends its
// next call as its last ends (at once, or a moment later) has one attempt
// in flight at a time, so that an answer of a slow lane, 20x the others',
// is a stretch in which nothing else ended, as a stall of the client's
// own process would be. The stall rule nets it to nothing; the lane's
// typical latency must not then become zero, against which every answer
// of every other lane would be latencyFactor times slower, and the fast
// lanes ejected for latency while the slow ones take every call.
func TestOneCallAtATimeEjectsTheSlowLanesNotTheFast(t *testing.T) {
	for _, think := range []time.Duration{0, 100 * time.Microsecond} {
		for seed := range uint64(200) {
			s := newSet(policy.Replicas{})
			s.rand = rand.New(rand.NewPCG(seed, 7)).Uint64
			now := t0
			var ejected []Ejection[pool]
			for range 600 {
				now = now.Add(think)
				l := s.Take(now, 0)
				d := 2 * time.Millisecond
				if l.Index%2 == 0 {
					d = 40 * time.Millisecond
				}
				now = now.Add(d)
				ejected = append(ejected, s.Done(l, now, d, policy.Success, Answer{}).Ejected...)
			}
			for _, e := range ejected {
				if e.Lane.Index%2 != 0 {
					t.Errorf("think %v, seed %d: fast lane %d ejected for %v, with lanes 0 and 2 20x slower", think, seed, e.Lane.Index, e.Reason)
				}
			}
			if len(ejected) == 0 {
				t.Errorf("think %v, seed %d: no slow lane ejected in 600 calls", think, seed)
			}
		}
	}
}

// TestAStallOfTheClientEndingEveryAttemptAtItsTimeoutEjectsNone: the
// client's own process stalls (a GC pause, CPU starvation, a SIGSTOP)
// with ten attempts in flight on each of four lanes, each with a timeout
// of 1 s, and resumes 2 s later: every attempt is ended at once by its
// timeout, a second after its deadline, with no answer read. Each is the
// client's doing, no evidence of its lane: none is ejected or taken out,
// and the next answers find every lane open. A replica whose attempts
// time out on time while the others answer is judged as before: five in
// a row eject its lane.
func TestAStallOfTheClientEndingEveryAttemptAtItsTimeoutEjectsNone(t *testing.T) {
	for _, late := range []time.Duration{time.Second, 0} {
		t.Run(fmt.Sprint("ended ", late, " late"), func(t *testing.T) {
			s := newSet(policy.Replicas{})
			now := warmLanes(s, t0, 400, 5*time.Millisecond)
			var flights []*Lane[pool]
			for range 40 {
				flights = append(flights, s.Take(now, 0))
			}
			now = now.Add(time.Second + late)
			var ejected []Ejection[pool]
			for _, l := range flights {
				ejected = append(ejected, s.Done(l, now, time.Second+late, policy.Failure, Answer{Kind: Mute, Late: late}).Ejected...)
			}
			var states [policy.MaxLanes]policy.LaneSnapshot
			s.States(now, &states)
			open := 0
			for _, ls := range states[:4] {
				if ls.State == policy.LaneOpen {
					open++
				}
			}
			switch {
			case late > 0 && (len(ejected) != 0 || open != 4):
				t.Errorf("ejected %v, %d of 4 lanes open, after a stall of the client ended every attempt at its timeout; want none ejected, all open", ejected, open)
			case late == 0 && len(ejected) != 2:
				t.Errorf("ejected %v after ten timeouts on time on each lane, want two (MaxEjected)", ejected)
			}
		})
	}
	t.Run("one replica hung, the others answering", func(t *testing.T) {
		// Lane 0's replica takes every attempt and says nothing; its
		// attempts end at their 1 s timeout, on time, or 5 ms late (a
		// busy host's timer), while the other lanes answer in 5 ms.
		s := newSet(policy.Replicas{})
		s.rand = rand.New(rand.NewPCG(1, 2)).Uint64
		m := newSim(s, 5*time.Millisecond, func(l *Lane[pool], _ time.Time) (time.Duration, policy.Outcome, Answer) {
			if l.Index == 0 {
				return time.Second + 5*time.Millisecond, policy.Failure, Answer{Kind: Mute, Late: 5 * time.Millisecond}
			}
			return 5 * time.Millisecond, policy.Success, Answer{}
		})
		m.run(15 * time.Second)
		if len(m.ejected) != 1 || m.ejected[0].Lane.Index != 0 || m.ejected[0].Reason != policy.EjectConsecutive {
			t.Errorf("ejected %v, want lane 0 for its failures in a row", m.ejected)
		}
	})
}

// TestARefusedLaneGetsOneAttemptPerDownFor: the first of three replicas
// is killed at +2s and left in Endpoints, at 200 calls/s, and Endpoints
// is asked again whenever a refresh is due (its answer still lists the
// dead address). Over the 7 s from +3s its lane gets one attempt per
// downFor at most, each at least downFor after the last, whether the
// calls send one leg at a time or a leg goes out beside each call's
// first, from a call whose legs went to the other two lanes already (its
// third, the only lane it has not used).
func TestARefusedLaneGetsOneAttemptPerDownFor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		third bool
	}{{"one leg at a time", false}, {"a third leg beside each call", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := addrSet(t, policy.Replicas{Refresh: 5 * time.Second}, "a", "b", "c")
			killed, from, to := t0.Add(2*time.Second), t0.Add(3*time.Second), t0.Add(10*time.Second)
			var inflight []flight
			var on []time.Time // the attempts' times on c, from `from`
			send := func(now time.Time, used uint64) {
				l := s.Take(now, used)
				f := flight{l: l, sent: now, due: now.Add(5 * time.Millisecond), o: policy.Success}
				if l.Addr == "c" && !now.Before(killed) {
					f.due, f.o, f.a = now.Add(time.Millisecond), policy.Failure, Answer{Kind: Unreached}
				}
				if l.Addr == "c" && !now.Before(from) && now.Before(to) {
					on = append(on, now)
				}
				inflight = append(inflight, f)
			}
			for now := t0; now.Before(to); now = now.Add(time.Millisecond) {
				k := 0
				for _, f := range inflight {
					if f.due.After(now) {
						inflight[k] = f
						k++
						continue
					}
					s.Done(f.l, now, now.Sub(f.sent), f.o, f.a)
				}
				inflight = inflight[:k]
				if s.StartRefresh(now) {
					s.Update(now, []string{"a", "b", "c"}, nil)
				}
				if now.Sub(t0)%(5*time.Millisecond) != 0 {
					continue
				}
				send(now, 0)
				if tc.third {
					send(now, 0b011)
				}
			}
			if most := int(to.Sub(from) / downFor); len(on) > most {
				t.Errorf("%d attempts on the refused lane over %v, want at most %d", len(on), to.Sub(from), most)
			}
			for i := 1; i < len(on); i++ {
				if d := on[i].Sub(on[i-1]); d < downFor {
					t.Errorf("attempts on the refused lane at +%v and +%v, %v apart, want at least %v", on[i-1].Sub(t0), on[i].Sub(t0), d, downFor)
					break
				}
			}
		})
	}
}

// TestPicksAtOnceSendARefusedLaneOneProbe: as a refused lane's block
// ends, picks made at once on several goroutines send it one probe
// between them, not one each that read it as having none in flight.
func TestPicksAtOnceSendARefusedLaneOneProbe(t *testing.T) {
	const rounds, pickers = 100, 8
	for r := range rounds {
		s := addrSet(t, policy.Replicas{Refresh: 5 * time.Second}, "a", "b", "c")
		c := s.view.Load().lanes[2]
		s.Done(s.Take(t0, 0b011), t0, time.Millisecond, policy.Failure, Answer{Kind: Unreached})
		at := t0.Add(downFor + time.Millisecond)
		var wg sync.WaitGroup
		var mu sync.Mutex
		on := 0
		start := make(chan struct{})
		for range pickers {
			wg.Go(func() {
				<-start
				if s.Take(at, 0) == c {
					mu.Lock()
					on++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if on > 1 {
			t.Fatalf("round %d: %d of %d picks at once sent the refused lane a probe, want at most 1", r, on, pickers)
		}
	}
}
