package slogobserver_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/slogobserver"
)

// laneAttempts sends, for each lane, that many successful attempts of key
// on it, then lets window pass.
func laneAttempts(obs *policy.Observer, key string, window time.Duration, counts map[string]int) {
	for lane, n := range counts {
		for range n {
			obs.AttemptDone(policy.AttemptInfo{Context: context.Background(), Key: key, Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Success, StatusCode: 200, Lane: lane})
		}
	}
	time.Sleep(window)
}

// TestSlogLaneStarved: a lane whose share of its key's attempts over a
// 10 s window is below a tenth of its fair share is logged once, at Warn,
// however long it stays so, and once, at Info, when it gets a fifth of
// its share or more again; a lane first seen in a window, an ejected
// lane, and a window with too few attempts to judge are not.
func TestSlogLaneStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		obs := slogobserver.New(slog.New(rec), slogobserver.Options{})
		const a, b, c, d = "10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80"
		const w = 10 * time.Second
		// The first window, in which the lanes are first seen, is not
		// judged; in the second, d has 1 attempt of 121, against a fair 30.25.
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 1})
		if recs := rec.take(); len(recs) != 0 {
			t.Fatalf("in the first windows:%s", messages(recs))
		}
		// The next attempt ends the second window.
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40})
		want := []record{{Level: slog.LevelWarn, Msg: "lane starved", Attrs: map[string]string{
			"key": "api", "lane": d, "attempts": "1", "share": "0.0083", "fair_share": "0.25", "since_ms": "10000",
		}}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after d's starved window (-want +got):\n%s", diff)
		}
		// Still starved, then too few attempts to judge: nothing more.
		laneAttempts(obs, "api", w, map[string]int{a: 10, b: 10})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 5})
		if recs := rec.take(); len(recs) != 0 {
			t.Fatalf("while d stays starved:%s", messages(recs))
		}
		// d at 5 of 125 is above a tenth of its share, below a fifth: no
		// change; at 10 of 130, above a fifth, it is fed again.
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 10})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 40})
		want = []record{{Level: slog.LevelInfo, Msg: "lane fed again", Attrs: map[string]string{
			"key": "api", "lane": d, "attempts": "10", "share": "0.0769", "fair_share": "0.25", "since_ms": "10000",
		}}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after d's fed window (-want +got):\n%s", diff)
		}
		// c ejected gets nothing: its ejection is its record, and the
		// others' fair share is a third. Back, it is judged from the
		// window after its return.
		obs.LaneEjected(policy.LaneEjection{Context: context.Background(), Key: "api", Addr: c, Index: 2, Reason: policy.EjectLatency, For: 30 * time.Second})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, d: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, d: 40})
		obs.LaneReturned(policy.LaneEjection{Context: context.Background(), Key: "api", Addr: c, Index: 2, Reason: policy.EjectLatency, For: 30 * time.Second})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 1, d: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40, d: 40})
		want = []record{
			{Level: slog.LevelWarn, Msg: "lane ejected", Attrs: map[string]string{"key": "api", "lane": c, "reason": "latency", "for_ms": "30000"}},
			{Level: slog.LevelInfo, Msg: "lane returned", Attrs: map[string]string{"key": "api", "lane": c, "reason": "latency", "for_ms": "30000"}},
		}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("around c's ejection (-want +got):\n%s", diff)
		}
		// Endpoints drops d, starved: it is forgotten, not logged.
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40})
		if recs := with(rec.take(), "lane starved"); len(recs) != 1 {
			t.Fatalf("d starved again: %d records, want 1:%s", len(recs), messages(recs))
		}
		obs.LanesChanged(policy.LaneSetChange{Context: context.Background(), Key: "api", Removed: []string{d}, Lanes: 3})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40, c: 40})
		if recs := rec.take(); len(recs) != 1 || recs[0].Msg != "lanes changed" {
			t.Errorf("after d left:%s", messages(recs))
		}
	})
}

// TestSlogLaneBeforeEndpoints: the lane that dials the request's own
// address before Endpoints' first answer, named by its index, is
// forgotten when an answer comes, not logged starved.
func TestSlogLaneBeforeEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		obs := slogobserver.New(slog.New(rec), slogobserver.Options{})
		const a, b = "10.0.0.1:80", "10.0.0.2:80"
		const w = 10 * time.Second
		laneAttempts(obs, "api", time.Second, map[string]int{"0": 5})
		obs.LanesChanged(policy.LaneSetChange{Context: context.Background(), Key: "api", Added: []string{a, b}, Lanes: 2})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40})
		laneAttempts(obs, "api", w, map[string]int{a: 40, b: 40})
		if recs := rec.take(); len(recs) != 1 || recs[0].Msg != "lanes changed" {
			t.Errorf("after Endpoints answered:%s", messages(recs))
		}
	})
}

// TestSlogLaneAttemptAllocatesNothing: at Info, an attempt on a lane
// already watched is counted with no allocation.
func TestSlogLaneAttemptAllocatesNothing(t *testing.T) {
	obs := slogobserver.New(slog.New(slog.NewJSONHandler(io.Discard, nil)), slogobserver.Options{})
	ok := policy.AttemptInfo{Context: context.Background(), Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Success, StatusCode: 200, Lane: "10.0.0.1:80"}
	obs.AttemptDone(ok)
	if n := testing.AllocsPerRun(100, func() { obs.AttemptDone(ok) }); n != 0 {
		t.Errorf("%v allocations an attempt on a lane, want 0", n)
	}
}
