package shedding

import (
	"context"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParsePriority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Priority
		ok   bool
	}{
		// Every spelling of each name: any ASCII case, the words joined by
		// nothing or by any run of '-' and '_', surrounding space trimmed.
		{"critical", Critical, true},
		{"CRITICAL", Critical, true},
		{"Critical", Critical, true},
		{"cRiTiCaL", Critical, true},
		{"degraded", Degraded, true},
		{"Degraded", Degraded, true},
		{"DEGRADED", Degraded, true},
		{"best-effort", BestEffort, true},
		{"best_effort", BestEffort, true},
		{"BEST_EFFORT", BestEffort, true},
		{"BEST-EFFORT", BestEffort, true},
		{"Best-Effort", BestEffort, true},
		{"Best_Effort", BestEffort, true},
		{"BestEffort", BestEffort, true},
		{"bestEffort", BestEffort, true},
		{"besteffort", BestEffort, true},
		{"BESTEFFORT", BestEffort, true},
		{"best--effort", BestEffort, true},
		{"best-_effort", BestEffort, true},
		{"best__-__effort", BestEffort, true},
		{"bulk", Bulk, true},
		{"BULK", Bulk, true},
		{"Bulk", Bulk, true},
		{" BEST-EFFORT\t", BestEffort, true},
		{"\r\n bulk \v\f", Bulk, true},
		{"\u00a0critical\u2003", Critical, true}, // TrimSpace's Unicode space

		// Anything else: an error, and Critical.
		{"", Critical, false},
		{"   ", Critical, false},
		{"-", Critical, false},
		{"_", Critical, false},
		{"urgent", Critical, false},
		{"bulk!", Critical, false},
		{"bulky", Critical, false},
		{"bul", Critical, false},
		{"best", Critical, false},
		{"effort", Critical, false},
		{"best effort", Critical, false}, // a space is not a separator
		{"best.effort", Critical, false},
		{"best-effort-", Critical, false}, // separators only between words
		{"-bulk", Critical, false},
		{"bulk_", Critical, false},
		{"_critical", Critical, false},
		{"crit-ical", Critical, false},
		{"de_graded", Critical, false},
		{"b-ulk", Critical, false},
		{"bes-teffort", Critical, false},
		{"best-efforts", Critical, false},
		{"bulk bulk", Critical, false},
		{"criticalbulk", Critical, false},
		{"0", Critical, false},
		{"3", Critical, false},
		{"priority(2)", Critical, false},
		{"bul\u212a", Critical, false}, // KELVIN SIGN folds to k in Unicode, not in ASCII
		{"\u017fulk", Critical, false}, // so does LATIN SMALL LETTER LONG S to s
		{"bulk\x00", Critical, false},
		{"\xffbulk", Critical, false},
	} {
		got, err := ParsePriority(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestPriorityString(t *testing.T) {
	for p, want := range map[Priority]string{
		Critical:   "critical",
		Degraded:   "degraded",
		BestEffort: "best_effort",
		Bulk:       "bulk",
		4:          "priority(4)",
		9:          "priority(9)",
		255:        "priority(255)",
	} {
		if got := p.String(); got != want {
			t.Errorf("Priority(%d).String() = %q, want %q", uint8(p), got, want)
		}
	}
}

func TestPriorityRoundTrips(t *testing.T) {
	for p := range Priority(NumPriorities) {
		if !p.Valid() {
			t.Errorf("%d not valid", p)
		}
		if got, err := ParsePriority(p.String()); err != nil || got != p {
			t.Errorf("ParsePriority(%q) = %v, %v", p.String(), got, err)
		}
	}
	// An unknown priority's String does not parse.
	for p := Priority(NumPriorities); p != 0; p++ {
		if p.Valid() {
			t.Errorf("%d valid", p)
		}
		if got, err := ParsePriority(p.String()); err == nil {
			t.Errorf("ParsePriority(%q) = %v, want an error", p.String(), got)
		}
	}
}

func TestPriorityContext(t *testing.T) {
	if p, ok := PriorityFrom(context.Background()); ok || p != Critical {
		t.Errorf("untagged: %v, %v; want Critical, false", p, ok)
	}
	if p, ok := PriorityFrom(WithPriority(context.Background(), Bulk)); !ok || p != Bulk {
		t.Errorf("tagged Bulk: %v, %v", p, ok)
	}
}

// spellings are the header values TestParsePriorityAllocatesNothing and
// BenchmarkParsePriority parse: the common spellings.
var spellings = []string{"critical", "Degraded", "BEST_EFFORT", "best-effort", "BestEffort", " bulk "}

// TestParsePriorityAllocatesNothing: the transport parses the priority
// header on every request that sets it.
func TestParsePriorityAllocatesNothing(t *testing.T) {
	for _, s := range spellings {
		if n := testing.AllocsPerRun(100, func() {
			if _, err := ParsePriority(s); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("ParsePriority(%q) allocates %v times, want 0", s, n)
		}
	}
}

func BenchmarkParsePriority(b *testing.B) {
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := ParsePriority(spellings[i%len(spellings)]); err != nil {
			b.Fatal(err)
		}
	}
}

// grammar is ParsePriority's, written independently of it: after
// strings.TrimSpace, an ASCII string that lower-cases to one of these.
var grammar = regexp.MustCompile(`^(critical|degraded|best[-_]*effort|bulk)$`)

// FuzzParsePriority checks that ParsePriority never panics, accepts what
// grammar accepts and nothing else, gives Critical with every error, and
// that every priority it returns round-trips through String.
func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{
		"critical", "DEGRADED", "best_effort", "Best-Effort", "besteffort", "best-_-effort", " bulk\t",
		"", "-", "best effort", "bulk_", "bul\u212a", "priority(2)", "\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePriority(s)
		trimmed := strings.TrimSpace(s)
		m := grammar.FindStringSubmatch(strings.ToLower(trimmed))
		if !isASCII(trimmed) {
			m = nil
		}
		if err != nil {
			if p != Critical {
				t.Errorf("ParsePriority(%q) = %v with error %v, want Critical", s, p, err)
			}
			if m != nil {
				t.Errorf("ParsePriority(%q) = %v, want %q accepted", s, err, m[1])
			}
			return
		}
		if m == nil {
			t.Fatalf("ParsePriority(%q) = %v, want an error", s, p)
		}
		if want := strings.NewReplacer("-", "", "_", "").Replace(m[1]); strings.ReplaceAll(p.String(), "_", "") != want {
			t.Errorf("ParsePriority(%q) = %v, want %s", s, p, m[1])
		}
		if !p.Valid() {
			t.Fatalf("ParsePriority(%q) = %d, not a bucket", s, uint8(p))
		}
		if q, err := ParsePriority(p.String()); err != nil || q != p {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v: %v does not round-trip", p.String(), q, err, p, p)
		}
	})
}

func isASCII(s string) bool {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// TestParsePriorityQuotesABoundedValue: a megabyte header costs its error
// no more than 64 bytes of it.
func TestParsePriorityQuotesABoundedValue(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	_, err := ParsePriority(huge)
	if err == nil {
		t.Fatal("ParsePriority of 1 MiB: no error")
	}
	if len(err.Error()) > 200 {
		t.Fatalf("ParsePriority of 1 MiB: error of %d bytes, want an error quoting at most 64 of them", len(err.Error()))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		_, _ = ParsePriority(huge)
	}
	runtime.ReadMemStats(&after)
	if perCall := (after.TotalAlloc - before.TotalAlloc) / 10; perCall > 4<<10 {
		t.Fatalf("ParsePriority of 1 MiB allocates %d bytes a call, want a few hundred", perCall)
	}
}
