package transport

import (
	"context"
	"net/http"
	"time"

	"github.com/resilix/resilix/internal/gate"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
	"github.com/resilix/resilix/shedding"
)

// call is the state of one logical call: its plan, what it may do, fixed
// before its first round; its tally, what it did; and the lanes it has
// used. It lives on RoundTrip's stack, except while a hedge is in flight:
// a hedged round works on a copy, and gives the call its tally back in
// one step (see hedged).
type call struct {
	callPlan
	callTally
	// used is the mask of the lanes the call has sent on (bit
	// lane.Lane.Index), read and set atomically: a hedged round's legs
	// pick concurrently.
	used uint64
}

// callPlan is what a call may do, and what for: set as RoundTrip reads the
// request and its key's set, and before the first round, never after.
type callPlan struct {
	t         *Transport
	s         *scope
	req       *http.Request
	ctx       context.Context
	start     time.Time
	prio      shedding.Priority
	prioNamed bool   // prio is the context's or a header's, not the default
	tenant    string // read only when a gate is fair between tenants, or for Propagate

	// What the call may do: its key's set, as an Override narrows it.
	attempts int           // wire attempts in all
	timeout  time.Duration // per attempt; 0: none
	mayRetry bool
	mayHedge bool
	tie      tieMode        // of the round about to start (see hedgeAfter)
	repeat   bool           // made for a request that is itself a repeat: no deposit
	deposit  gate.Deposited // what the call's Deposit added to the budget

	// rb keeps a copy of a body without GetBody for replay; nil when the
	// request has GetBody or no body, or the call would never replay it.
	rb *httpx.Replay

	rep *Report // the caller's, or nil
}

// callTally is what a call did, as its rounds and their legs count it. A
// hedged round's legs count in the round's copy, by the round's owner.
type callTally struct {
	wire         int                // wire attempts made
	freed        int                // of them, free retries of attempts that never left (see unsentElsewhere)
	retriesBegun int                // retries begun: past their backoff, and asked of the gates
	outcome      policy.Outcome     // of what the call returns
	retryAsked   bool               // what the call returns asks for a retry (see leg.retryAsked)
	retryReason  policy.RetryReason // why the next round is a retry, once backoff has said
	// elsewhere: the next round goes to a lane the call has not used,
	// open when backoff looked (see backoff); a retry of an attempt
	// that never left then draws no token from the budget.
	elsewhere bool
	// tooLarge: the retry not sent was not sent because rb's body outgrew
	// the buffer (RetrySkip.BodyTooLarge).
	tooLarge bool

	// What the caller's Report needs, kept only when there is one (rep),
	// but for the counts.
	retriesSent int                   // retries that went on the wire
	hedges      int                   // hedge legs started
	hedgeWon    bool                  // a hedge answered the call with a Success
	skip        policy.SkipReason     // why the retry asked for was not sent
	refusal     *policy.RejectedError // the refusal that ended the call or its retry
	lane        string                // the lane of the answer returned (laneName)
}

// spent returns the wire attempts that count against the call's Attempts:
// all but the free retries of attempts that never left (freed).
func (t *callTally) spent() int { return t.wire - t.freed }
