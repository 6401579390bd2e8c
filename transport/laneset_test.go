package transport

import (
	"errors"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

// TestLanesChangedOncePerChange: Observer.LanesChanged hears each answer of
// Endpoints that changes a key's lanes, with the addresses added and
// removed, and not an answer that fails, is empty, or names the lanes'
// addresses again (duplicates and empty ones dropped, as the lanes take
// them).
func TestLanesChangedOncePerChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		f.serve("api:80", "own")
		f.serveFour()
		r := &scripted{asked: make(chan string, 1), answers: make(chan answer)}
		var got []policy.LaneSetChange
		rt := newLaneTransport(t, f, Config{
			Policies: policy.Set{Replicas: &policy.Replicas{Endpoints: r, Refresh: 30 * time.Second}},
			Observer: &policy.Observer{LanesChanged: func(c policy.LaneSetChange) {
				if c.Context == nil {
					t.Error("LanesChanged with a nil Context")
				}
				c.Context = nil
				got = append(got, c)
			}},
		})
		calls := 0
		refresh := func(wait time.Duration, a answer) {
			t.Helper()
			time.Sleep(wait)
			calls++
			if code, err := laneGet(t, rt, "http://api/", strconv.Itoa(calls)); err != nil || code != 200 {
				t.Fatalf("%d, %v", code, err)
			}
			<-r.asked
			r.answers <- a
			synctest.Wait()
		}
		refresh(0, answer{err: errors.New("no answer")})
		refresh(time.Second, answer{addrs: []string{"a:80", "", "b:80", "a:80"}})
		refresh(30*time.Second, answer{addrs: []string{"b:80", "a:80"}}) // the same lanes
		refresh(30*time.Second, answer{addrs: []string{}})
		refresh(time.Second, answer{addrs: []string{"b:80", "c:80"}})
		want := []policy.LaneSetChange{
			{Key: "api", Added: []string{"a:80", "b:80"}, Lanes: 2},
			{Key: "api", Added: []string{"c:80"}, Removed: []string{"a:80"}, Lanes: 2},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("LanesChanged heard (-want +got):\n%s", diff)
		}
		if m := rt.Measured("api"); m.Lanes != 2 {
			t.Errorf("Measured says %d lanes, want 2", m.Lanes)
		}
	})
}
