package slogobserver

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"

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
