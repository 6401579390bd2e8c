package slogobserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/httptestutil"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
	"github.com/resilix/resilix/slogobserver"
	"github.com/resilix/resilix/transport"
)

// TestSlogOperatorScenario: a host failing 20% of its calls with 503s,
// called 60 times a second for 30 seconds, half of the calls Bulk, more
// than its rate limit of 40 a second lets through, so that Bulk is shed;
// the set is the README's quick start, with a throttler and the rate
// limit. A handler at Info, slog's default, gets at most 20 lines in
// those 30 seconds: what changed, and a summary per key per interval,
// never a line per call.
func TestSlogOperatorScenario(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		var bulkShed, failed atomic.Int64
		count := &policy.Observer{
			Refused: func(r policy.Refusal) {
				if r.Priority == shedding.Bulk {
					bulkShed.Add(1)
				}
			},
			AttemptDone: func(a policy.AttemptInfo) {
				if a.Outcome == policy.Failure {
					failed.Add(1)
				}
			},
		}
		up := httptestutil.NewUpstream(httptestutil.Options{
			Latency: httptestutil.Constant(20 * time.Millisecond),
			Faults:  []httptestutil.Fault{{Probability: 0.2, Status: http.StatusServiceUnavailable}},
			Seed:    1,
		})
		tr, err := transport.New(transport.Config{
			Base: up.RoundTripper(),
			Policies: policy.Set{
				Attempts:  3,
				Retry:     &policy.Retry{},
				Hedge:     &policy.Hedge{},
				Throttler: &policy.Throttler{},
				Breaker:   &policy.Breaker{},
				Limiter:   &policy.Limiter{},
				RateLimit: &policy.RateLimit{PerSecond: 40},
				Timeout:   &policy.Timeout{PerAttempt: 2 * time.Second},
			},
			Observer: policy.JoinObservers(slogobserver.New(slog.New(rec), slogobserver.Options{}), count),
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		const rate, span = 60, 30 * time.Second
		var wg sync.WaitGroup
		for i := range int(span / (time.Second / rate)) {
			ctx := context.Background()
			if i%2 == 1 {
				ctx = shedding.WithPriority(ctx, shedding.Bulk)
			}
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			time.Sleep(time.Second / rate)
		}
		wg.Wait()

		recs := rec.take()
		byMsg := map[string]int{}
		for _, r := range recs {
			byMsg[r.Level.String()+" "+r.Msg]++
		}
		var lines []string
		for _, k := range slices.Sorted(maps.Keys(byMsg)) {
			lines = append(lines, fmt.Sprintf("%s: %d", k, byMsg[k]))
		}
		t.Logf("%d lines at Info and above in %v at %d calls/s (%d attempts failed, %d Bulk attempts shed): %s",
			len(recs), span, rate, failed.Load(), bulkShed.Load(), strings.Join(lines, ", "))
		// The scenario is the one described: 20% of ~1800 first attempts
		// failing, and most of the 900 Bulk calls above the limit shed.
		if failed.Load() < 200 || bulkShed.Load() < 200 {
			t.Fatalf("%d attempts failed and %d Bulk attempts shed: not the scenario", failed.Load(), bulkShed.Load())
		}
		if len(recs) > 20 {
			t.Errorf("%d lines at Info and above in %v, want at most 20", len(recs), span)
		}
		// The summaries, one each 10s (DefaultSummary) but the last,
		// unwritten for want of an event after it, count what the lines
		// per call would have said.
		sums := with(recs, "summary")
		if len(sums) < 2 {
			t.Fatalf("%d summaries in %v, want one each %v but the last:%s", len(sums), span, slogobserver.DefaultSummary, messages(recs))
		}
		var summed int64
		for _, r := range sums {
			n, err := strconv.ParseInt(r.Attrs["attempts_failed"], 10, 64)
			if err != nil || r.Attrs["key"] != "api.test" || !strings.Contains(r.Attrs["refused"], "rate_limit=") {
				t.Errorf("summary %v: want the key, attempts_failed and refusals by the rate limit", r.Attrs)
			}
			summed += n
		}
		if summed > failed.Load() || summed < failed.Load()/2 {
			t.Errorf("the summaries count %d failed attempts of %d, want at least the half before the last summary", summed, failed.Load())
		}
	})
}

// TestSlogSummary: the counts of every key since the first counted event
// are written together, once the interval has passed, by the next
// counted event of any key, which starts the next interval; the key with
// the most counts comes first, and a key with no events since is not
// written again.
func TestSlogSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		obs := slogobserver.New(slog.New(rec), slogobserver.Options{Summary: 10 * time.Second})
		ctx := context.Background()
		fail := func(key string) {
			obs.AttemptDone(policy.AttemptInfo{Context: ctx, Key: key, Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure, StatusCode: 503})
		}
		refuse := func(key string, g policy.Gate) {
			obs.Refused(policy.Refusal{Context: ctx, Key: key, Kind: policy.AttemptFirst, Gate: g, Priority: shedding.Bulk})
		}
		fail("a")
		refuse("a", policy.GateRateLimit)
		time.Sleep(4 * time.Second)
		fail("b")
		refuse("a", policy.GateThrottler)
		time.Sleep(6 * time.Second)
		if recs := rec.take(); len(recs) != 0 {
			t.Fatalf("before an event past the interval:%s", messages(recs))
		}
		fail("b") // the interval is over: it starts the next
		want := []record{
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{
				"key": "a", "since_ms": "10000", "attempts_failed": "1", "refused": "[throttler=1 rate_limit=1]",
			}},
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{
				"key": "b", "since_ms": "6000", "attempts_failed": "1",
			}},
		}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after the first interval (-want +got):\n%s", diff)
		}
		time.Sleep(20 * time.Second)
		fail("c")
		want = []record{{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{
			"key": "b", "since_ms": "20000", "attempts_failed": "1",
		}}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after the second interval (-want +got):\n%s", diff)
		}
		time.Sleep(9 * time.Second)
		fail("a")
		time.Sleep(time.Second)
		fail("a")
		want = []record{
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{
				"key": "a", "since_ms": "1000", "attempts_failed": "1",
			}},
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{
				"key": "c", "since_ms": "10000", "attempts_failed": "1",
			}},
		}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after the third interval (-want +got):\n%s", diff)
		}
	})
}

// TestSlogManyHostsFailingOnce: a client calling 601 hosts over 30 s,
// one call each, every one failing, writes at most 20 lines at Info in
// those 30 s: each interval, a summary for each of the 4 keys with the
// most failures and one for the others, which says how many keys it
// sums; Flush then writes the last interval's, and the summaries count
// every failure.
func TestSlogManyHostsFailingOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		logs := slogobserver.NewLogger(slog.New(rec), slogobserver.Options{})
		tr, err := transport.New(transport.Config{
			Base: httptestutil.InMemory(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			})),
			Observer: logs.Observer(),
		})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		const hosts, span = 601, 30 * time.Second
		for i := range hosts {
			resp, err := client.Get(fmt.Sprintf("http://host-%03d.test/", i))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			time.Sleep(span / (hosts - 1))
		}
		recs := rec.take()
		t.Logf("%d lines at Info and above in %v for %d hosts failing once:%s", len(recs), span, hosts, messages(recs))
		if len(recs) > 20 {
			t.Errorf("%d lines at Info and above in %v, want at most 20", len(recs), span)
		}
		logs.Flush()
		last := rec.take()
		if len(last) == 0 {
			t.Errorf("Flush wrote nothing, want the last interval's summaries")
		}
		var failed, keys int
		for _, r := range append(recs, last...) {
			if r.Msg != "summary" {
				t.Errorf("%s at %v, want only summaries", r.Msg, r.Level)
				continue
			}
			n, _ := strconv.Atoi(r.Attrs["attempts_failed"])
			failed += n
			if others, ok := r.Attrs["other_keys"]; ok {
				n, _ := strconv.Atoi(others)
				keys += n
			} else {
				keys++
			}
		}
		if failed != hosts || keys != hosts {
			t.Errorf("the summaries count %d failed attempts of %d keys, want %d of %d", failed, keys, hosts, hosts)
		}
		logs.Flush()
		if recs := rec.take(); len(recs) != 0 {
			t.Errorf("a second Flush wrote:%s", messages(recs))
		}
	})
}

// TestSlogFlush: Flush writes what was counted at once, ranked and bound
// as at the interval's end, and the next counted event starts a new
// interval; with nothing counted it writes nothing.
func TestSlogFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{level: slog.LevelInfo}
		logs := slogobserver.NewLogger(slog.New(rec), slogobserver.Options{SummaryKeys: 1})
		obs := logs.Observer()
		fail := func(key string) {
			obs.AttemptDone(policy.AttemptInfo{Context: context.Background(), Key: key, Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure, StatusCode: 503})
		}
		logs.Flush()
		fail("a")
		fail("b")
		fail("b")
		fail("c")
		time.Sleep(3 * time.Second)
		logs.Flush()
		want := []record{
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{"key": "b", "since_ms": "3000", "attempts_failed": "2"}},
			{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{"other_keys": "2", "since_ms": "3000", "attempts_failed": "2"}},
		}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("Flush (-want +got):\n%s", diff)
		}
		time.Sleep(8 * time.Second)
		fail("a") // starts an interval: 10 s from here, not from the first
		time.Sleep(9 * time.Second)
		fail("a")
		if recs := rec.take(); len(recs) != 0 {
			t.Errorf("within the interval Flush started:%s", messages(recs))
		}
		time.Sleep(time.Second)
		fail("a")
		want = []record{{Level: slog.LevelInfo, Msg: "summary", Attrs: map[string]string{"key": "a", "since_ms": "10000", "attempts_failed": "2"}}}
		if diff := cmp.Diff(want, rec.take()); diff != "" {
			t.Errorf("after the interval (-want +got):\n%s", diff)
		}
	})
}

// TestSlogDurationsInMilliseconds: a JSON handler gets durations as
// numbers of milliseconds, fractions kept, in fields named for the unit.
func TestSlogDurationsInMilliseconds(t *testing.T) {
	var buf bytes.Buffer
	obs := slogobserver.New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), slogobserver.Options{Summary: -1})
	obs.AttemptDone(policy.AttemptInfo{Context: context.Background(), Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure, Latency: 3500 * time.Microsecond, StatusCode: 503})
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["latency_ms"] != 3.5 {
		t.Errorf("latency_ms = %#v in %s, want the number 3.5", got["latency_ms"], buf.Bytes())
	}
}

// TestSlogCountingAllocatesNothing: at Info, a per-call event of a key
// already counting is counted with no allocation.
func TestSlogCountingAllocatesNothing(t *testing.T) {
	h := slog.NewJSONHandler(io.Discard, nil) // Info
	obs := slogobserver.New(slog.New(h), slogobserver.Options{Summary: time.Hour})
	ctx := context.Background()
	failed := policy.AttemptInfo{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Attempt: 1, Outcome: policy.Failure, StatusCode: 503}
	refused := policy.Refusal{Context: ctx, Key: "api", Kind: policy.AttemptFirst, Gate: policy.GateRateLimit, Priority: shedding.Bulk}
	obs.AttemptDone(failed)
	if n := testing.AllocsPerRun(100, func() { obs.AttemptDone(failed); obs.Refused(refused) }); n != 0 {
		t.Errorf("%v allocations a counted event, want 0", n)
	}
}
