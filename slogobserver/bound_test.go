package slogobserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/policy"
)

// TestSummaryKeysBounded: however many keys fail in an interval, the
// Logger counts at most maxTallies of them one by one, and the events of
// the others are in the other keys' summary, not lost.
func TestSummaryKeysBounded(t *testing.T) {
	var out strings.Builder
	lg := NewLogger(slog.New(slog.NewTextHandler(&out, nil)), Options{})
	const keys = 3 * maxTallies
	for i := range keys {
		lg.Observer().AttemptDone(policy.AttemptInfo{Context: context.Background(), Key: fmt.Sprint("host-", i), Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure})
	}
	lg.mu.Lock()
	n := len(lg.tallies)
	lg.mu.Unlock()
	if n > maxTallies {
		t.Errorf("%d keys counted one by one, want at most %d", n, maxTallies)
	}
	lg.Flush()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != DefaultSummaryKeys+1 {
		t.Errorf("%d summaries, want %d:\n%s", len(lines), DefaultSummaryKeys+1, out.String())
	}
	var failed int
	for _, l := range lines {
		_, v, _ := strings.Cut(l, "attempts_failed=")
		n, err := strconv.Atoi(strings.Fields(v)[0])
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		failed += n
	}
	if failed != keys {
		t.Errorf("the summaries count %d failed attempts, want %d", failed, keys)
	}
}

// TestLaneKeysBounded: however many keys send attempts over lanes, the
// Logger watches the lanes of at most maxWatchedKeys keys, at most
// policy.MaxLanes each, and forgets a key with no attempt for two windows.
func TestLaneKeysBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lg := NewLogger(slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
		attempt := func(key, lane string) {
			lg.Observer().AttemptDone(policy.AttemptInfo{Context: context.Background(), Key: key, Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Success, Lane: lane})
		}
		for i := range 3 * maxWatchedKeys {
			attempt(fmt.Sprint("host-", i), "0")
		}
		for i := range 2 * policy.MaxLanes {
			attempt("host-0", fmt.Sprint("10.0.0.", i, ":80"))
		}
		lg.lanes.mu.Lock()
		keys, lanes := len(lg.lanes.keys), len(lg.lanes.keys["host-0"].lanes)
		lg.lanes.mu.Unlock()
		if keys > maxWatchedKeys || lanes > policy.MaxLanes {
			t.Errorf("%d keys watched, %d lanes of one, want at most %d and %d", keys, lanes, maxWatchedKeys, policy.MaxLanes)
		}
		time.Sleep(3 * laneWindow)
		attempt("host-0", "0")
		lg.lanes.mu.Lock()
		keys = len(lg.lanes.keys)
		lg.lanes.mu.Unlock()
		if keys != 1 {
			t.Errorf("%d keys watched after 30 s with attempts of one, want 1", keys)
		}
	})
}
