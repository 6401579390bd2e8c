package gate

import (
	"math"
	"testing"
	"time"

	"github.com/resilix/resilix/policy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestBudgetSteps(t *testing.T) {
	// Ratio 0.5, floor 1/s, max 2: starts full.
	b := newBudget(policy.Budget{Ratio: 0.5, MinPerSecond: 1, Max: 2}, t0)
	type step struct {
		at      time.Duration
		op      string // "deposit", "withdraw"
		want    bool   // for withdraw
		balance float64
	}
	steps := []step{
		{0, "withdraw", true, 1},
		{0, "withdraw", true, 0},
		{0, "withdraw", false, 0},
		{0, "deposit", false, 0.5},
		{0, "withdraw", false, 0.5},
		{0, "deposit", false, 1},
		{0, "withdraw", true, 0},
		{500 * time.Millisecond, "withdraw", false, 0.5}, // the floor accrues 0.5 in 500ms
		{time.Second, "withdraw", true, 0},
		{time.Hour, "deposit", false, 2}, // capped at Max
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "deposit":
			b.Deposit(now)
		case "withdraw":
			if got := b.Withdraw(now); got != s.want {
				t.Fatalf("step %d: Withdraw = %v, want %v", i, got, s.want)
			}
		}
		if got := b.Balance(now); math.Abs(got-s.balance) > 1e-9 {
			t.Fatalf("step %d: balance %v, want %v", i, got, s.balance)
		}
	}
}

// TestBudgetTakeBack: what TakeBack removes is what Deposit added, so a
// deposit taken back leaves the balance as it was, full or not, and never
// below zero.
func TestBudgetTakeBack(t *testing.T) {
	b := newBudget(policy.Budget{Ratio: 0.5, MinPerSecond: -1, Max: 2}, t0)
	if added := b.Deposit(t0); added != (Deposited{}) {
		t.Fatalf("a full budget's Deposit added %v", added)
	}
	b.TakeBack(Deposited{})
	if got := b.Balance(t0); got != 2 {
		t.Fatalf("balance %v after taking back nothing, want 2", got)
	}
	b.Withdraw(t0)
	b.Withdraw(t0)
	added := b.Deposit(t0)
	if added.Tokens != 0.5 {
		t.Fatalf("Deposit added %v, want Ratio (0.5) tokens", added)
	}
	b.TakeBack(added)
	if got := b.Balance(t0); got != 0 {
		t.Fatalf("balance %v after taking the deposit back, want 0", got)
	}
	b.TakeBack(Deposited{Tokens: 1, Hedges: 1})
	if got := b.Balance(t0); got != 0 {
		t.Fatalf("balance %v after taking back more than there is, want 0", got)
	}
	b.Deposit(t0)
	b.Deposit(t0)
	b.Deposit(t0)
	if added := b.Deposit(t0); added.Tokens != 0.5 {
		t.Fatalf("Deposit to 2 added %v, want 0.5 tokens", added)
	}
	if added := b.Deposit(t0); added.Tokens != 0 {
		t.Fatalf("Deposit at Max added %v, want no tokens", added)
	}
	b.TakeBack(Deposited{Tokens: 0.5})
	if added := b.Deposit(t0); added.Tokens != 0.5 {
		t.Fatalf("Deposit after a take-back from Max added %v, want 0.5: the budget is not full", added)
	}
	var off *Budget
	off.TakeBack(Deposited{Tokens: 1})
}

func TestBudgetBoundsAmplification(t *testing.T) {
	// With no floor, 1000 calls at Ratio 0.1 allow at most Max + 100 retries.
	b := newBudget(policy.Budget{Ratio: 0.1, MinPerSecond: -1}, t0)
	retries := 0
	for range 1000 {
		b.Deposit(t0)
		for b.Withdraw(t0) {
			retries++
		}
	}
	if retries > 110 || retries < 100 {
		t.Fatalf("retries = %d, want within [100, 110]", retries)
	}
}

func TestBudgetDefaultsAndOff(t *testing.T) {
	b := newBudget(policy.Budget{}, t0)
	if got := b.Balance(t0); got != 20 {
		t.Fatalf("default starting balance = %v, want 20", got)
	}
	var off *Budget = newBudget(policy.Budget{Ratio: -1}, t0)
	if off != nil {
		t.Fatal("negative Ratio should turn the budget off")
	}
	off.Deposit(t0)
	if !off.Withdraw(t0) || !math.IsInf(off.Balance(t0), 1) {
		t.Fatal("a nil budget must always allow")
	}
}

func TestBudgetAllocs(t *testing.T) {
	b := newBudget(policy.Budget{}, t0)
	if n := testing.AllocsPerRun(100, func() { b.Deposit(t0); b.Withdraw(t0) }); n != 0 {
		t.Fatalf("Deposit+Withdraw allocate %v times", n)
	}
}

// TestBudgetFullAccruesNothing: a budget that stayed full for an hour
// (Deposits there return at once, without reading or writing the time of
// the last accrual) owes nothing for that hour once it is drawn down: the
// floor accrues from the moment it stopped being full.
func TestBudgetFullAccruesNothing(t *testing.T) {
	b := newBudget(policy.Budget{Ratio: 0.1, MinPerSecond: 1, Max: 3}, t0)
	later := t0.Add(time.Hour)
	b.Deposit(later)
	for range 3 {
		if !b.Withdraw(later) {
			t.Fatal("a full budget refused a withdrawal")
		}
	}
	if got := b.Balance(later); got != 0 {
		t.Fatalf("balance %v right after emptying it, want 0: the hour it was full accrued", got)
	}
	if got := b.Balance(later.Add(2 * time.Second)); got != 2 {
		t.Errorf("balance %v two seconds later, want 2 (the floor, 1 a second)", got)
	}
	b.Deposit(later.Add(time.Hour)) // full again, through accrual: back on the fast path
	if got := b.Balance(later.Add(time.Hour)); got != 3 {
		t.Errorf("balance %v, want Max (3)", got)
	}
}

// TestBudgetRefundSteps: a refund gives back one token, up to Max, and
// keeps the full fast path honest: a refund that fills the bucket puts
// Deposit back on it, and one made while full adds nothing and accrues
// nothing for the time the bucket stayed full.
func TestBudgetRefundSteps(t *testing.T) {
	// Ratio 0.5, floor 1/s, max 2: starts full.
	b := newBudget(policy.Budget{Ratio: 0.5, MinPerSecond: 1, Max: 2}, t0)
	type step struct {
		at      time.Duration
		op      string // "deposit", "withdraw", "refund"
		balance float64
	}
	steps := []step{
		{0, "refund", 2}, // full: nothing to give back
		{0, "withdraw", 1},
		{0, "withdraw", 0},
		{0, "refund", 1},
		{0, "deposit", 1.5},
		{0, "refund", 2}, // capped at Max, not 2.5
		{time.Hour, "refund", 2},
		{time.Hour, "withdraw", 1},                      // the hour it stayed full accrued nothing
		{time.Hour + 250*time.Millisecond, "refund", 2}, // 0.25 of floor, then one token, capped
		{time.Hour + 250*time.Millisecond, "withdraw", 1},
		{time.Hour + 250*time.Millisecond, "withdraw", 0},
		{time.Hour + 500*time.Millisecond, "refund", 1.25}, // the floor's 0.25 accrued first
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "deposit":
			b.Deposit(now)
		case "withdraw":
			if !b.Withdraw(now) {
				t.Fatalf("step %d: Withdraw refused", i)
			}
		case "refund":
			b.Refund(now)
		}
		if got := b.Balance(now); math.Abs(got-s.balance) > 1e-9 {
			t.Fatalf("step %d (%s at %v): balance %v, want %v", i, s.op, s.at, got, s.balance)
		}
	}
}

// TestBudgetRefundsBoundWasteNotHelp: at Ratio 0.2 with no floor, calls
// whose first attempt fails one time in five, and whose retry succeeds
// when it is sent, are all retried through once a successful retry earns
// its token back; when every retry fails, the retries stay within Ratio
// of the calls (plus the Max the bucket starts with).
func TestBudgetRefundsBoundWasteNotHelp(t *testing.T) {
	cfg := policy.Budget{Ratio: 0.2, MinPerSecond: -1, Max: 10}
	const calls = 10000

	b := newBudget(cfg, t0)
	skipped := 0
	for i := range calls {
		b.Deposit(t0)
		if i%5 != 0 {
			continue // the first attempt succeeded
		}
		if !b.Withdraw(t0) {
			skipped++
			continue
		}
		b.Refund(t0) // the retry succeeded
	}
	if skipped != 0 {
		t.Errorf("%d of %d retries refused; a retry that succeeds should cost nothing", skipped, calls/5)
	}

	b = newBudget(cfg, t0)
	retries := 0
	for range calls {
		b.Deposit(t0)
		for b.Withdraw(t0) {
			retries++ // and it failed: no refund
		}
	}
	if bound := cfg.Ratio*calls + cfg.Max; float64(retries) > bound {
		t.Errorf("%d retries in a full outage, want at most Ratio×calls + Max = %v", retries, bound)
	}
}

func TestBudgetRefundNil(t *testing.T) {
	var b *Budget
	b.Refund(t0) // a nil budget is unlimited: nothing to give back, no panic
	if !math.IsInf(b.Balance(t0), 1) {
		t.Fatal("a nil budget must stay unlimited")
	}
}

// TestBudgetHedgeAllowance: hedges draw from their allowance as well as
// the bucket (half of Ratio a call, half of Max up to 10), so a run of
// hedges that all lose spends at most 10 tokens plus a tenth of the calls,
// and leaves the rest of the bucket to retries.
func TestBudgetHedgeAllowance(t *testing.T) {
	b := newBudget(policy.Budget{}, t0) // Ratio 0.2, Max 20: an allowance of 10
	for i := range 10 {
		if !b.WithdrawHedge(t0) {
			t.Fatalf("hedge %d refused with the allowance full", i+1)
		}
	}
	if b.WithdrawHedge(t0) {
		t.Fatal("an 11th hedge was let through: the allowance holds 10")
	}
	if got := b.Balance(t0); got != 10 {
		t.Fatalf("balance %v after 10 hedges, want 10", got)
	}
	if !b.Withdraw(t0) {
		t.Fatal("a retry refused with 10 tokens left: the allowance is the hedges' alone")
	}
	// A hedge that wins gives both tokens back.
	b.RefundHedge(t0)
	if !b.WithdrawHedge(t0) {
		t.Fatal("no hedge after a won hedge's refund")
	}

	// A brownout: every call comes due for a hedge, every hedge loses.
	b = newBudget(policy.Budget{}, t0)
	hedges, now := 0, t0
	for range 1000 {
		now = now.Add(time.Millisecond) // 1000 calls a second, for a second
		b.Deposit(now)
		if b.WithdrawHedge(now) {
			hedges++
		}
	}
	// 10 held, 0.1 a call: 110. (The bucket alone would allow 20 + 0.2 a
	// call + the floor's 10: 230.)
	if hedges < 105 || hedges > 111 {
		t.Fatalf("%d hedges over 1000 calls that all lose, want about 110: 10 held and half of Ratio a call", hedges)
	}
}

// TestBudgetTakeBackEarnsNoHedges: a call taken back earns neither
// retries nor hedges, also when only one of the two buckets had room for
// its deposit (the floor refills the retries' tokens, never the hedges').
func TestBudgetTakeBackEarnsNoHedges(t *testing.T) {
	now := time.Unix(0, 0)
	b := NewBudget(policy.Budget{Ratio: 0.2, MinPerSecond: 10, Max: 20}, now)
	for b.WithdrawHedge(now) {
	}
	now = now.Add(2 * time.Second) // the floor refills the tokens, not the hedges
	for range 20 {
		b.TakeBack(b.Deposit(now))
	}
	if b.WithdrawHedge(now) {
		t.Fatal("calls taken back earned a hedge")
	}
}

// TestBudgetHedgesLeaveTheRetriesHalf: whatever Max, a burst of hedges
// that all lose, from a full bucket, takes at most half of it, so the retry
// after them still goes. Below a Max of 2 the allowance holds less than a
// token and no hedge draws from it: with Max 1, one losing hedge would
// take the one token the next 503's retry needs. From a Max of 2 at least
// one hedge goes.
func TestBudgetHedgesLeaveTheRetriesHalf(t *testing.T) {
	for _, max := range []float64{1, 1.5, 1.99, 2, 2.5, 3, 5, 20, 21, 40, 100} {
		b := newBudget(policy.Budget{Max: max, MinPerSecond: -1}, t0)
		hedges := 0
		for b.WithdrawHedge(t0) {
			hedges++
		}
		if float64(hedges) > max/2 {
			t.Errorf("Max %v: %d hedges from a full bucket, want at most %v (half of it)", max, hedges, max/2)
		}
		if want := max >= 2; (hedges > 0) != want {
			t.Errorf("Max %v: %d hedges from a full bucket, want some %v", max, hedges, want)
		}
		if !b.Withdraw(t0) {
			t.Errorf("Max %v: the retry after %d hedges refused", max, hedges)
		}
		// However many calls deposit, a Max below 2 never lets a hedge
		// through.
		if max < 2 {
			b = newBudget(policy.Budget{Max: max, Ratio: 1, MinPerSecond: -1}, t0)
			for range 100 {
				b.Deposit(t0)
				if b.WithdrawHedge(t0) {
					t.Fatalf("Max %v: a hedge drew from the allowance", max)
				}
			}
		}
	}
}

// TestBudgetHedgesOfASmallClientAfterACalm: a client of 12.8 calls a
// second (one of a fleet of 200 small ones) that hedged nothing through a
// calm of 10 s, then sees every call come due for a hedge that loses (a
// collapse, where every attempt waits): its allowance has let go of what
// it held above one token through the calm, so the collapse's first
// second gets one hedge and about what the client's own calls deposited
// over two seconds, where a full allowance sent 10 and more; and its
// hedges over the next 10 s stay at about a tenth of its calls.
func TestBudgetHedgesOfASmallClientAfterACalm(t *testing.T) {
	const rate = 12.8
	b := newBudget(policy.Budget{}, t0)
	now := t0
	every := time.Duration(float64(time.Second) / rate)
	for now.Before(t0.Add(10 * time.Second)) {
		now = now.Add(every)
		b.Deposit(now)
	}
	hedges := func(d time.Duration) int {
		n := 0
		for end := now.Add(d); now.Before(end); {
			now = now.Add(every)
			b.Deposit(now)
			if b.WithdrawHedge(now) {
				n++
			}
		}
		return n
	}
	if n := hedges(time.Second); n > 3 {
		t.Errorf("%d hedges in the collapse's first second, want at most 3 (a token, and what 2 s of calls deposit)", n)
	}
	if n := hedges(10 * time.Second); n > 14 {
		t.Errorf("%d hedges in the next 10 s of 128 calls, want at most 14 (a tenth of them, and a token)", n)
	}
}
