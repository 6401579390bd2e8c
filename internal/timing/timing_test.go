package timing

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if !Sleep(t.Context(), time.Second) || time.Since(start) != time.Second {
			t.Fatalf("Sleep(1s) = false or took %v", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		start = time.Now()
		if Sleep(ctx, time.Second) || time.Since(start) != 300*time.Millisecond {
			t.Fatalf("Sleep past the deadline returned true or took %v", time.Since(start))
		}
		if Sleep(ctx, 0) || !Sleep(t.Context(), -1) {
			t.Fatal("Sleep(0) must report the context's liveness")
		}
	})
}

func TestSince(t *testing.T) {
	start := time.Now()
	before := time.Now()
	now := Since(start)
	after := time.Now()
	if now.Before(before) || now.After(after) {
		t.Fatalf("Since = %v, want between %v and %v", now, before, after)
	}
	if now.Round(0) == now {
		t.Fatal("Since lost the monotonic clock reading")
	}
	if d := now.Round(0).Sub(after.Round(0)); d > time.Second || d < -time.Second {
		t.Fatalf("Since's wall clock is %v from time.Now's", d)
	}
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		time.Sleep(time.Second)
		if got, want := Since(start), time.Now(); !got.Equal(want) {
			t.Fatalf("in a bubble Since = %v, want time.Now %v", got, want)
		}
	})
}

var sinkTime time.Time

// BenchmarkSince is Since against time.Now, the reading it replaces.
func BenchmarkSince(b *testing.B) {
	start := time.Now()
	b.Run("Since", func(b *testing.B) {
		for b.Loop() {
			sinkTime = Since(start)
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			sinkTime = time.Now()
		}
	})
}
