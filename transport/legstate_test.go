package transport

import (
	"strings"
	"sync"
	"testing"
)

// TestLegStateSettlesEachLegOnce walks a hedged round's leg and its owner
// through every order of their steps on the leg's state word: the leg
// comes back from the wire (or panics on it) and posts its answer; the
// owner deciding the round drops it; the round's timer expires it. Each
// order must leave the leg in exactly one of three ends: its answer
// posted to the owner, dropped by the owner once back (the leg disposes
// of its answer), or lost on the wire (it teaches nothing); and the leg
// must see the timeout only when it came before the leg was back.
func TestLegStateSettlesEachLegOnce(t *testing.T) {
	for _, tc := range []struct {
		steps string // b: comeBack, p: post, d: drop, e: expire
		end   uint32 // legPosted, legDropped or legLost
		timed bool   // the leg saw its timeout as it came back
	}{
		{"bp", legPosted, false},
		{"bpd", legPosted, false},
		{"bdp", legDropped, false},
		{"dbp", legLost, false},
		{"p", legPosted, false},   // panicked on the wire, then posted
		{"pd", legPosted, false},  // the same, the owner after
		{"dp", legLost, false},    // the owner first
		{"ebp", legPosted, true},  // timed out, then back
		{"bep", legPosted, false}, // back first: the timeout is too late
		{"edbp", legLost, true},
		{"bedp", legDropped, false},
	} {
		t.Run(tc.steps, func(t *testing.T) {
			var l leg
			l.shared = true
			var posted, expired, timed bool
			var dropped uint32
			for _, s := range tc.steps {
				switch s {
				case 'b':
					timed = l.comeBack()&legExpired != 0
				case 'p':
					posted = l.post()
				case 'd':
					dropped = l.drop()
				case 'e':
					expired = l.expire()
				}
			}
			st := l.state
			ends := 0
			for _, e := range []uint32{legPosted, legDropped, legLost} {
				if st&e != 0 {
					ends++
				}
			}
			if ends != 1 || st&tc.end == 0 {
				t.Fatalf("state %b: want exactly the end %b", st, tc.end)
			}
			if posted != (tc.end == legPosted) {
				t.Errorf("post reported %v, the end being %b", posted, tc.end)
			}
			if strings.Contains(tc.steps, "d") && (dropped&legPosted != 0) != (tc.end == legPosted) {
				t.Errorf("drop left %b: the owner must await exactly the posted answers", dropped)
			}
			if strings.Contains(tc.steps, "e") && expired != tc.timed {
				t.Errorf("expire reported %v, want %v", expired, tc.timed)
			}
			if strings.Contains(tc.steps, "b") && timed != tc.timed {
				t.Errorf("the leg saw its timeout: %v, want %v", timed, tc.timed)
			}
		})
	}
}

// TestLegStateRaces runs a leg's and its owner's steps concurrently, many
// times: each run must end in exactly one of the three ends, and post and
// drop must agree on it.
func TestLegStateRaces(t *testing.T) {
	for range 2000 {
		var l leg
		var wg sync.WaitGroup
		var posted bool
		var dropped uint32
		wg.Go(func() {
			l.comeBack()
			posted = l.post()
		})
		wg.Go(func() { dropped = l.drop() })
		wg.Wait()
		switch st := l.state; {
		case posted:
			if dropped&legPosted == 0 || st&(legDropped|legLost) != 0 {
				t.Fatalf("posted, but the owner saw %b (state %b)", dropped, st)
			}
		case st&legDropped != 0 == (st&legLost != 0):
			t.Fatalf("neither posted nor settled once: state %b", st)
		}
	}
}
