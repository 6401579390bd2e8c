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
