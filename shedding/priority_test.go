package shedding

import (
	"context"
	"testing"
)

func TestParsePriority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Priority
		ok   bool
	}{
		{"critical", Critical, true},
		{"Degraded", Degraded, true},
		{" BEST-EFFORT\t", BestEffort, true},
		{"bulk", Bulk, true},
		{"best_effort", Critical, false},
		{"", Critical, false},
		{"urgent", Critical, false},
		{"bulk!", Critical, false},
	} {
		got, err := ParsePriority(tc.in)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v, ok=%v", tc.in, got, err, tc.want, tc.ok)
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
	if Priority(9).Valid() || Priority(9).String() != "Priority(9)" {
		t.Errorf("out of range: %v, %q", Priority(9).Valid(), Priority(9).String())
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
