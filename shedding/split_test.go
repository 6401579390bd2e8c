package shedding

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// mixOf builds a mix in Priority order: Critical, Degraded, BestEffort, Bulk.
func mixOf(c, d, be, b float64) [NumPriorities]float64 {
	return [NumPriorities]float64{c, d, be, b}
}

func TestSplitBottomUp(t *testing.T) {
	tests := []struct {
		name string
		f    float64
		mix  [NumPriorities]float64
		want [NumPriorities]float64
	}{
		{"nothing to shed", 0, mixOf(10, 10, 10, 10), mixOf(0, 0, 0, 0)},
		{"negative is nothing", -0.5, mixOf(10, 10, 10, 10), mixOf(0, 0, 0, 0)},
		{"NaN is nothing", math.NaN(), mixOf(10, 10, 10, 10), mixOf(0, 0, 0, 0)},
		{"part of bulk", 0.1, mixOf(10, 10, 10, 10), mixOf(0, 0, 0, 0.4)},
		{"exactly bulk", 0.25, mixOf(10, 10, 10, 10), mixOf(0, 0, 0, 1)},
		{"bulk and part of best effort", 0.3, mixOf(10, 10, 10, 10), mixOf(0, 0, 0.2, 1)},
		{"down to degraded", 0.6, mixOf(10, 10, 10, 10), mixOf(0, 0.4, 1, 1)},
		{"critical once the rest is gone", 0.9, mixOf(10, 10, 10, 10), mixOf(0.6, 1, 1, 1)},
		{"everything", 1, mixOf(10, 10, 10, 10), mixOf(1, 1, 1, 1)},
		{"more than everything", 3, mixOf(10, 10, 10, 10), mixOf(1, 1, 1, 1)},
		// Netflix's incident: a 12× prefetch (Bulk) spike. Shedding half of
		// all traffic takes it from Bulk alone.
		{"bulk spike absorbs it", 0.5, mixOf(8, 0, 0, 12*8), mixOf(0, 0, 0, 0.5*104/96)},
		{"skewed mix", 0.2, mixOf(70, 20, 9, 1), mixOf(0, 0.5, 1, 1)},
		// A bucket with no traffic is fully shed once the volume reaches it.
		{"empty bulk", 0.25, mixOf(10, 10, 20, 0), mixOf(0, 0, 0.5, 1)},
		{"empty bucket above the volume", 0.1, mixOf(10, 0, 20, 10), mixOf(0, 0, 0, 0.4)},
		{"only critical traffic", 0.3, mixOf(50, 0, 0, 0), mixOf(0.3, 1, 1, 1)},
		{"no history counts as even", 0.3, mixOf(0, 0, 0, 0), mixOf(0, 0, 0.2, 1)},
		{"negative counts as zero", 0.25, mixOf(10, 10, 20, -5), mixOf(0, 0, 0.5, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Split(tt.f, tt.mix)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
				t.Errorf("Split(%v, %v) (-want +got):\n%s", tt.f, tt.mix, diff)
			}
			checkSplit(t, tt.f, tt.mix, got)
		})
	}
}

// checkSplit checks the invariants of Split's result p for f and mix.
func checkSplit(t *testing.T, f float64, mix, p [NumPriorities]float64) {
	t.Helper()
	var total, shed float64
	for b := range p {
		if !(p[b] >= 0 && p[b] <= 1) {
			t.Fatalf("Split(%v, %v)[%v] = %v, want a probability", f, mix, Priority(b), p[b])
		}
		if b > 0 && p[b] < p[b-1] {
			t.Errorf("Split(%v, %v): %v sheds %v, less than the more important %v's %v", f, mix, Priority(b), p[b], Priority(b-1), p[b-1])
		}
		m := max(mix[b], 0)
		total += m
		shed += m * p[b]
	}
	if f > 0 && f < 1 && total > 0 {
		// The expected shed volume is f × total.
		if math.Abs(shed-f*total) > 1e-9*total {
			t.Errorf("Split(%v, %v) sheds %v of %v, want %v", f, mix, shed, total, f*total)
		}
		for b := Degraded; b < NumPriorities; b++ {
			if p[Critical] > 0 && p[b] < 1 {
				t.Errorf("Split(%v, %v) sheds Critical (%v) while %v is at %v", f, mix, p[Critical], b, p[b])
			}
		}
	}
}

// TestCriticalNeverShedWhileLowerSheddable is acceptance criterion 6 for the
// rule itself: over random mixes and fractions below 1, Critical sheds
// nothing while any lower bucket with traffic is not fully shed.
func TestCriticalNeverShedWhileLowerSheddable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		var mix [NumPriorities]float64
		for b := range mix {
			switch r.IntN(4) {
			case 0: // an empty bucket
			case 1:
				mix[b] = float64(r.IntN(10))
			default:
				mix[b] = r.ExpFloat64() * 1000
			}
		}
		f := r.Float64()
		p := Split(f, mix)
		checkSplit(t, f, mix, p)
		if t.Failed() {
			return
		}
	}
}

func TestSplitDoesNotAllocate(t *testing.T) {
	mix := mixOf(5, 4, 3, 2)
	var sink [NumPriorities]float64
	if n := testing.AllocsPerRun(100, func() { sink = Split(0.4, mix) }); n != 0 {
		t.Errorf("Split allocates %v times, want 0", n)
	}
	_ = sink
}
