package gate

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/resilix/resilix/policy"
)

func TestBulkheadFailFast(t *testing.T) {
	g := newBulkhead(policy.Bulkhead{MaxConcurrent: 2})
	ctx := t.Context()
	for i, want := range []bool{true, true, false, false} {
		if got := g.Acquire(ctx); got != want {
			t.Fatalf("Acquire #%d = %v, want %v", i, got, want)
		}
	}
	if got := g.InFlight(); got != 2 {
		t.Fatalf("InFlight = %d, want 2", got)
	}
	g.Release()
	if !g.Acquire(ctx) {
		t.Fatal("Acquire after Release refused")
	}
	g.Release()
	g.Release()
	if got := g.InFlight(); got != 0 {
		t.Fatalf("InFlight = %d, want 0", got)
	}
}

// TestBulkheadWait runs one waiter against a full bulkhead of one slot, in
// a bubble, and checks when it returns and with what.
func TestBulkheadWait(t *testing.T) {
	tests := []struct {
		name      string
		maxWait   time.Duration
		deadline  time.Duration // from the start; 0: none; negative: already passed
		releaseAt time.Duration // when the holder releases; 0: never
		cancelAt  time.Duration // when the caller cancels; 0: never
		want      bool
		wantAfter time.Duration
	}{
		{name: "fail fast", maxWait: 0, releaseAt: 100 * time.Millisecond, want: false, wantAfter: 0},
		{name: "slot frees", maxWait: time.Second, releaseAt: 300 * time.Millisecond, want: true, wantAfter: 300 * time.Millisecond},
		{name: "MaxWait runs out", maxWait: time.Second, want: false, wantAfter: time.Second},
		{name: "slot frees too late", maxWait: time.Second, releaseAt: 2 * time.Second, want: false, wantAfter: time.Second},
		{name: "deadline sooner", maxWait: time.Second, deadline: 200 * time.Millisecond, want: false, wantAfter: 200 * time.Millisecond},
		{name: "deadline later", maxWait: time.Second, deadline: 5 * time.Second, want: false, wantAfter: time.Second},
		{name: "slot frees before the deadline", maxWait: time.Second, deadline: 500 * time.Millisecond, releaseAt: 300 * time.Millisecond, want: true, wantAfter: 300 * time.Millisecond},
		{name: "deadline already passed", maxWait: time.Second, deadline: -time.Millisecond, releaseAt: 100 * time.Millisecond, want: false, wantAfter: 0},
		{name: "cancelled while waiting", maxWait: time.Second, cancelAt: 250 * time.Millisecond, want: false, wantAfter: 250 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				g := newBulkhead(policy.Bulkhead{MaxConcurrent: 1, MaxWait: tt.maxWait})
				if !g.Acquire(t.Context()) {
					t.Fatal("first Acquire refused")
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				if tt.deadline != 0 {
					ctx, cancel = context.WithDeadline(ctx, time.Now().Add(tt.deadline))
					defer cancel()
				}
				released := false
				if tt.releaseAt > 0 {
					time.AfterFunc(tt.releaseAt, func() { released = true; g.Release() })
				}
				if tt.cancelAt > 0 {
					time.AfterFunc(tt.cancelAt, cancel)
				}
				start := time.Now()
				got := g.Acquire(ctx)
				if after := time.Since(start); got != tt.want || after != tt.wantAfter {
					t.Fatalf("Acquire = %v after %v, want %v after %v", got, after, tt.want, tt.wantAfter)
				}
				if w := g.waiters(); w != 0 {
					t.Fatalf("Waiting = %d after the wait, want 0", w)
				}
				time.Sleep(3 * time.Second) // every AfterFunc has run
				synctest.Wait()
				if got {
					g.Release()
				}
				if !released {
					g.Release()
				}
				if n := g.InFlight(); n != 0 {
					t.Fatalf("InFlight = %d at the end, want 0", n)
				}
			})
		})
	}
}

// Waiters are admitted in the order they came, and waiters that give up
// take nothing with them.
func TestBulkheadWaitersFIFOAndNoLeak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBulkhead(policy.Bulkhead{MaxConcurrent: 2, MaxWait: time.Second})
		g.Acquire(t.Context())
		g.Acquire(t.Context())

		var (
			mu       sync.Mutex
			admitted []int
			wg       sync.WaitGroup
		)
		for i := range 6 {
			// Waiters 1, 3 and 5 give up after 150ms; the others wait up to MaxWait.
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			if i%2 == 1 {
				ctx, cancel = context.WithTimeout(t.Context(), 150*time.Millisecond)
			}
			wg.Go(func() {
				defer cancel()
				if g.Acquire(ctx) {
					mu.Lock()
					admitted = append(admitted, i)
					mu.Unlock()
				}
			})
			synctest.Wait() // waiter i is blocked before i+1 starts
		}
		if w := g.waiters(); w != 6 {
			t.Fatalf("Waiting = %d, want 6", w)
		}
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if w := g.waiters(); w != 3 {
			t.Fatalf("Waiting = %d after the impatient gave up, want 3", w)
		}
		for range 3 { // one slot at a time
			g.Release()
			synctest.Wait()
		}
		wg.Wait()
		if diff := cmp.Diff([]int{0, 2, 4}, admitted); diff != "" {
			t.Fatalf("admission order (-want +got):\n%s", diff)
		}
		if n := g.InFlight(); n != 2 { // one original holder and the three admitted, less three releases
			t.Fatalf("InFlight = %d, want 2", n)
		}
		g.Release()
		g.Release()
		if n, w := g.InFlight(), g.waiters(); n != 0 || w != 0 {
			t.Fatalf("InFlight, Waiting = %d, %d at the end, want 0, 0", n, w)
		}
	})
}

// Many waiters racing releases and their own deadlines: every slot taken
// is given back, whoever won.
func TestBulkheadConcurrentNoLeak(t *testing.T) {
	g := newBulkhead(policy.Bulkhead{MaxConcurrent: 3, MaxWait: time.Millisecond})
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 500 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration((i+j)%3)*100*time.Microsecond)
				if g.Acquire(ctx) {
					if n := g.InFlight(); n > 3 || n < 1 {
						t.Errorf("InFlight = %d while holding a slot of 3", n)
					}
					g.Release()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if n, w := g.InFlight(), g.waiters(); n != 0 || w != 0 {
		t.Fatalf("InFlight, Waiting = %d, %d at the end, want 0, 0", n, w)
	}
}

func TestBulkheadReleaseWithoutAcquirePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Release without Acquire did not panic")
		}
	}()
	newBulkhead(policy.Bulkhead{MaxConcurrent: 1}).Release()
}

func TestBulkheadAllocs(t *testing.T) {
	ctx := t.Context()
	g := newBulkhead(policy.Bulkhead{MaxConcurrent: 1, MaxWait: time.Second})
	if allocs := testing.AllocsPerRun(1000, func() {
		if !g.Acquire(ctx) {
			t.Fatal("refused")
		}
		g.Release()
	}); allocs != 0 {
		t.Fatalf("Acquire+Release: %v allocs, want 0", allocs)
	}
	full := newBulkhead(policy.Bulkhead{MaxConcurrent: 1})
	full.Acquire(ctx)
	if allocs := testing.AllocsPerRun(1000, func() {
		if full.Acquire(ctx) {
			t.Fatal("admitted beyond MaxConcurrent")
		}
	}); allocs != 0 {
		t.Fatalf("fail-fast refusal: %v allocs, want 0", allocs)
	}
}

// TestBulkheadTryAcquireNeverWaits: with MaxWait set, TryAcquire on a
// full bulkhead refuses at once, queues nothing, and takes a slot once one
// is free.
func TestBulkheadTryAcquireNeverWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newBulkhead(policy.Bulkhead{MaxConcurrent: 1, MaxWait: time.Second})
		if !g.TryAcquire() {
			t.Fatal("TryAcquire on an empty bulkhead refused")
		}
		start := time.Now()
		if g.TryAcquire() {
			t.Fatal("TryAcquire on a full bulkhead took a slot")
		}
		if waited := time.Since(start); waited != 0 {
			t.Errorf("TryAcquire waited %v, want 0", waited)
		}
		if n := g.waiters(); n != 0 {
			t.Errorf("%d waiters after TryAcquire, want 0", n)
		}
		g.Release()
		if !g.TryAcquire() {
			t.Fatal("TryAcquire after Release refused")
		}
		g.Release()
		if got := g.InFlight(); got != 0 {
			t.Fatalf("InFlight = %d, want 0", got)
		}
	})
}
