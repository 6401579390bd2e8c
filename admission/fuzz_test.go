package admission

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/shedding"
)

// FuzzHeaders feeds the four headers anything, from a trusted caller or
// not, and checks the handler against a reference reading built on strconv
// and shedding.ParsePriority: it never panics; next sees a valid priority,
// the caller's only when trusted and readable; a deadline exactly when the
// timeout reads as at most a day, at arrival plus it; an attempt number
// exactly when it reads as 1 to 2³¹ − 1; a request is refused, 504,
// exactly when its timeout is 0; and every value read as malformed is
// counted once. Each input runs in a synctest bubble, so that no time
// passes while it is served and deadlines compare exactly.
func FuzzHeaders(f *testing.F) {
	for _, seed := range []struct {
		prio, tenant, timeout, attempt string
		trusted                        bool
	}{
		{"critical", "acme", "250", "1", true},
		{"critical", "acme", "250", "1", false},
		{"BEST-EFFORT", "", "0", "2", true},
		{" bulk ", "t", " 1500 ", " 3 ", true},
		{"urgent", "x", "-5", "0", true},
		{"", "", "", "", false},
		{"best_effort" + strings.Repeat("-", 30), "é", "86400000", "2147483647", true},
		{"bulk\x00", "\r\n", "86400001", "2147483648", true},
		{strings.Repeat("bulk", 100), strings.Repeat("t", 100), "000000000000000000000000001", "1e3", true},
		{"Critical", "a", "99999999999999999999", "+1", true},
	} {
		f.Add(seed.prio, seed.tenant, seed.timeout, seed.attempt, seed.trusted)
	}
	f.Fuzz(func(t *testing.T, prio, tenantID, timeout, att string, trusted bool) {
		synctest.Test(t, func(t *testing.T) {
			var s seen
			h := mustHandler(t, probe(&s), Config{
				Trust:           func(*http.Request) bool { return trusted },
				DefaultPriority: shedding.Degraded,
			})
			r := newRequest(context.Background())
			// Set directly: the fuzzer's strings need not be valid on the
			// wire, and the handler must not care.
			r.Header["Resilix-Priority"] = []string{prio}
			r.Header["Resilix-Tenant"] = []string{tenantID}
			r.Header["Resilix-Timeout-Ms"] = []string{timeout}
			r.Header["Resilix-Attempt"] = []string{att}
			arrival := time.Now()
			w := serve(h, r)

			malformed := uint64(0)
			wantPrio := shedding.Degraded
			if trusted {
				if p, ok := refPriority(prio); ok {
					wantPrio = p
				} else {
					malformed++
				}
			}
			ms, timeoutOK := refUint(timeout, uint64(maxTimeout.Milliseconds()))
			n, attemptOK := refUint(att, math.MaxInt32)
			attemptOK = attemptOK && n >= 1
			if !timeoutOK {
				malformed++
			}
			if !attemptOK {
				malformed++
			}
			if got := h.snapshot().MalformedHeaders; got != malformed {
				t.Errorf("%d malformed headers counted, want %d", got, malformed)
			}
			left := time.Duration(ms) * time.Millisecond
			if timeoutOK && ms == 0 {
				if w.Code != http.StatusGatewayTimeout || s.called != 0 {
					t.Fatalf("no time left: %d, next called %d times; want 504, never", w.Code, s.called)
				}
				return
			}
			if w.Code != http.StatusOK || s.called != 1 {
				t.Fatalf("status %d, next called %d times; want 200, once", w.Code, s.called)
			}
			if !s.hasPrio || s.prio != wantPrio {
				t.Errorf("priority %v (%v), want %v", s.prio, s.hasPrio, wantPrio)
			}
			if wantTenant := map[bool]string{true: tenantID}[trusted]; s.tenant != wantTenant || !s.hasTenant {
				t.Errorf("tenant %q (%v), want %q", s.tenant, s.hasTenant, wantTenant)
			}
			if s.hasDeadline != timeoutOK || (timeoutOK && !s.deadline.Equal(arrival.Add(left))) {
				t.Errorf("deadline in %v (%v), want %v after arrival (%v)", s.deadline.Sub(arrival), s.hasDeadline, left, timeoutOK)
			}
			if s.hasAttempt != attemptOK || (attemptOK && uint64(s.attempt) != n) {
				t.Errorf("attempt %d (%v), want %d (%v)", s.attempt, s.hasAttempt, n, attemptOK)
			}
		})
	})
}

// refPriority is the reference reading of a priority: ParsePriority of at
// most maxPriorityLen bytes.
func refPriority(v string) (shedding.Priority, bool) {
	if len(v) > maxPriorityLen {
		return 0, false
	}
	p, err := shedding.ParsePriority(v)
	return p, err == nil
}

// refUint is the reference reading of a number: ASCII digits only, with
// surrounding white space trimmed, as strconv parses them, at most limit.
func refUint(v string, limit uint64) (uint64, bool) {
	v = strings.TrimSpace(v)
	if v == "" || strings.TrimLeft(v, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil && n <= limit
}
