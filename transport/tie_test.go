package transport

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/resilix/resilix/admission"
	"github.com/resilix/resilix/internal/httpx"
	"github.com/resilix/resilix/policy"
)

// tieReplica is a server of one worker behind admission.Handler, whose
// limiter is fixed at that worker, so that a tied request is told it
// started when the worker takes it. It counts the requests its handler
// ran, and serves each in service, or holds it while hold is set.
type tieReplica struct {
	ran     atomic.Int64
	service time.Duration
	mu      sync.Mutex
	hold    chan struct{} // non-nil: the handler waits for it to close
	status  atomic.Int64  // 0: 200
	marked  atomic.Int64  // requests that came marked as tied
}

func (r *tieReplica) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.ran.Add(1)
	if req.Header.Get(httpx.TieHeader) != "" {
		r.marked.Add(1)
	}
	r.mu.Lock()
	hold := r.hold
	r.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-req.Context().Done():
			return
		}
	}
	d := r.service
	if req.Header.Get("X-Slow") != "" {
		d = 20 * time.Millisecond
	}
	select {
	case <-time.After(d):
	case <-req.Context().Done():
		return
	}
	if s := r.status.Load(); s != 0 {
		w.WriteHeader(int(s))
	}
	io.WriteString(w, "ok")
}

// tieFleet serves four addresses, a:80 ... d:80, each with one
// tieReplica behind admission (unless plain), on an in-memory network.
type tieFleet struct {
	f    *fleet
	reps map[string]*tieReplica
}

func newTieFleet(t *testing.T, plain bool) *tieFleet {
	tf := &tieFleet{f: newFleet(), reps: map[string]*tieReplica{}}
	for _, a := range four {
		r := &tieReplica{service: time.Millisecond}
		tf.reps[a[:1]] = r
		var h http.Handler = r
		if !plain {
			var err error
			h, err = admission.Handler(r, admission.Config{Limiter: policy.Limiter{InitialLimit: 1, MinLimit: 1, MaxLimit: 1, QueueFactor: 20}})
			if err != nil {
				t.Fatal(err)
			}
		}
		tf.f.net.Listen(a, h)
	}
	return tf
}

func (tf *tieFleet) marked() (n int64) {
	for _, r := range tf.reps {
		n += r.marked.Load()
	}
	return n
}

func (tf *tieFleet) ran() (n int64) {
	for _, r := range tf.reps {
		n += r.ran.Load()
	}
	return n
}

// tieEvents counts a transport's tie events.
type tieEvents struct {
	sent, tiedSent, cancelled, twice atomic.Int64
}

func (e *tieEvents) observer() *policy.Observer {
	return &policy.Observer{
		HedgeStarted: func(h policy.HedgeInfo) {
			e.sent.Add(1)
			if h.Tied {
				e.tiedSent.Add(1)
			}
		},
		TieCancelled: func(policy.HedgeInfo) { e.cancelled.Add(1) },
		TieRanTwice:  func(policy.HedgeInfo) { e.twice.Add(1) },
	}
}

func tiedSet() policy.Set {
	return policy.Set{
		Attempts: 2,
		Budget:   policy.Budget{Ratio: -1},
		Hedge:    &policy.Hedge{Quantile: 0.9, MaxConcurrent: 2, Tied: true},
		Replicas: &policy.Replicas{Endpoints: Static(four...)},
	}
}

// TestATiedTwinWaitingInAQueueIsCancelledWhenItsFirstLegStarts: once a key
// has heard its servers speak ties, a call whose first leg waits in a
// busy replica's queue sends its twin after the ties' delay, far below
// the hedge threshold; the twin starts at once elsewhere, the first leg
// is cancelled while it still waits, and never runs. Each call is
// answered in about a service time plus the delay, with one handler run.
func TestATiedTwinWaitingInAQueueIsCancelledWhenItsFirstLegStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tf := newTieFleet(t, false)
		for _, r := range tf.reps {
			r.service = 5 * time.Millisecond
		}
		var ev tieEvents
		rt := newLaneTransport(t, tf.f, Config{Policies: tiedSet(), Observer: ev.observer()})
		prime(t, rt, "http://api/")
		for i := range 100 {
			laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
		}
		ties := rt.scopes.lookup("api").hedge.Ties()
		delay, ok := ties.Delay(time.Now())
		if !ok {
			t.Fatal("the key has not learned its servers speak ties after 100 calls")
		}
		threshold, _ := rt.scopes.lookup("api").hedge.Threshold(time.Now())
		if 2*delay > threshold {
			t.Fatalf("ties' delay %v, threshold %v: want the delay well below", delay, threshold)
		}
		if n := ev.sent.Load(); n != 0 {
			t.Fatalf("%d hedges while warming on an idle fleet, want 0", n)
		}

		// Replica a's worker is held: every leg there waits in its queue.
		hold := make(chan struct{})
		tf.reps["a"].mu.Lock()
		tf.reps["a"].hold = hold
		tf.reps["a"].mu.Unlock()
		holder := make(chan struct{})
		go func() {
			defer close(holder)
			// Takes a's worker, as another client's long request.
			req, _ := http.NewRequest(http.MethodGet, "http://a:80/", nil)
			if resp, err := tf.f.net.Transport().RoundTrip(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		ranBefore := tf.ran()

		const calls = 200
		var slow int
		for i := range calls {
			start := time.Now()
			if code, err := laneGet(t, rt, "http://api/", "c"+strconv.Itoa(i)); err != nil || code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, err)
			}
			if time.Since(start) > 5*time.Millisecond+delay {
				slow++
			}
		}
		synctest.Wait()
		ran := tf.ran() - ranBefore
		close(hold)
		<-holder
		synctest.Wait()

		cancelled, tied := ev.cancelled.Load(), ev.tiedSent.Load()
		t.Logf("delay %v, threshold %v: %d calls, %d twins, %d cancelled, %d ran twice, %d handler runs, %d slower than a service time and the delay",
			delay, threshold, calls, tied, cancelled, ev.twice.Load(), ran, slow)
		if tied == 0 || cancelled < tied {
			t.Errorf("%d twins sent and %d legs cancelled: want every call that met a's queue tied, and one leg of each cancelled", tied, cancelled)
		}
		if ran != calls {
			t.Errorf("%d handler runs for %d calls, want one each: a leg cancelled in a's queue ran", ran, calls)
		}
		if slow != 0 {
			t.Errorf("%d of %d calls waited longer than a service time and the ties' delay", slow, calls)
		}
		if n := ev.twice.Load(); n != 0 {
			t.Errorf("%d rounds ran twice, want 0", n)
		}
	})
}

// TestTiesAgainstAServerThatSendsNoSignalAreHedging: a server that sends
// no signal (no admission in front) is never taken to speak ties: the
// key hedges at its threshold, and sends no more legs than without ties.
func TestTiesAgainstAServerThatSendsNoSignalAreHedging(t *testing.T) {
	runs := map[bool]int64{}
	for _, tied := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			tf := newTieFleet(t, true)
			var ev tieEvents
			set := tiedSet()
			set.Hedge.Tied = tied
			rt := newLaneTransport(t, tf.f, Config{Policies: set, Observer: ev.observer()})
			prime(t, rt, "http://api/")
			for i := range 400 {
				// One call in ten is slow, on every leg.
				req, _ := http.NewRequest(http.MethodGet, "http://api/", nil)
				if i%10 == 9 {
					req.Header.Set("X-Slow", "1")
				}
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			synctest.Wait()
			if rt.scopes.lookup("api").hedge.Ties().Speaks() {
				t.Error("a server that sends no signal is taken to speak ties")
			}
			if n := ev.tiedSent.Load(); n != 0 {
				t.Errorf("%d tied twins sent to a server that sends no signal", n)
			}
			runs[tied] = ev.sent.Load()
			t.Logf("Tied %v: %d hedges", tied, runs[tied])
		})
	}
	if runs[false] < 30 {
		t.Errorf("%d hedges without Tied for 40 slow calls: the test hedges too little to compare", runs[false])
	}
	if runs[true] != runs[false] {
		t.Errorf("hedges sent: %d with Tied, %d without; want the same", runs[true], runs[false])
	}
}

// TestATiedLegThatStartedAndThenFailsIsRetried: the leg that said it
// started had its twin cancelled; its failure then is the round's, and
// the call's retry goes on as usual.
func TestATiedLegThatStartedAndThenFailsIsRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tf := newTieFleet(t, false)
		var ev tieEvents
		set := tiedSet()
		set.Attempts = 3
		set.Retry = &policy.Retry{}
		rt := newLaneTransport(t, tf.f, Config{Policies: set, Observer: ev.observer()})
		prime(t, rt, "http://api/")
		for i := range 100 {
			laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
		}
		if !rt.scopes.lookup("api").hedge.Ties().Speaks() {
			t.Fatal("the key has not learned its servers speak ties")
		}
		for _, r := range tf.reps {
			r.status.Store(http.StatusInternalServerError)
		}
		tf.reps["d"].status.Store(0)
		ok := 0
		for i := range 20 {
			code, err := laneGet(t, rt, "http://api/", "f"+strconv.Itoa(i))
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if code == http.StatusOK {
				ok++
			}
		}
		synctest.Wait()
		if ok < 15 {
			t.Errorf("%d of 20 calls succeeded with one healthy replica of four and 3 attempts, want at least 15", ok)
		}
	})
}

// TestAPlainPOSTIsNeverTied: a request that may not be sent twice is
// never marked, whether the key is learning or has learned ties, so no
// server is ever asked to tie it.
func TestAPlainPOSTIsNeverTied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tf := newTieFleet(t, false)
		rt := newLaneTransport(t, tf.f, Config{Policies: tiedSet()})
		prime(t, rt, "http://api/")
		post := func() {
			req, _ := http.NewRequest(http.MethodPost, "http://api/", nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		for range 50 {
			post()
		}
		for i := range 100 {
			laneGet(t, rt, "http://api/", "warm"+strconv.Itoa(i))
		}
		if !rt.scopes.lookup("api").hedge.Ties().Speaks() {
			t.Fatal("the key has not learned its servers speak ties")
		}
		before := tf.marked()
		for range 50 {
			post()
		}
		if got := tf.marked() - before; got != 0 {
			t.Errorf("%d plain POSTs reached a server marked as tied, want 0", got)
		}
		synctest.Wait()
	})
}

// TestAHostileInformationalAnswerIsNoSignal: a 103 whose tie header is
// not exactly the start signal teaches nothing, and a server that sends
// 1xx answers without end fails the attempt rather than holding it.
func TestAHostileInformationalAnswerIsNoSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet()
		var mode atomic.Int64 // 0: wrong signals; 1: a flood of 103s
		hostile := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			if mode.Load() == 0 {
				for _, v := range [][]string{{"Started"}, {"started", "started"}, {"started;v=2"}, {""}} {
					h[httpx.TieHeader] = v
					w.WriteHeader(http.StatusEarlyHints)
				}
				h[httpx.TieHeader] = []string{httpx.TieStarted}
				w.WriteHeader(http.StatusContinue) // the right header on the wrong code
				delete(h, httpx.TieHeader)
			} else {
				h.Set(httpx.TieHeader, httpx.TieStarted)
				for range 50 {
					w.WriteHeader(http.StatusEarlyHints)
				}
				delete(h, httpx.TieHeader)
			}
			select {
			case <-time.After(time.Millisecond):
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "ok")
		})
		for _, a := range four {
			f.net.Listen(a, hostile)
		}
		rt := newLaneTransport(t, f, Config{Policies: tiedSet()})
		prime(t, rt, "http://api/")
		for i := range 60 {
			if code, err := laneGet(t, rt, "http://api/", strconv.Itoa(i)); err != nil || code != http.StatusOK {
				t.Fatalf("call %d: %d %v", i, code, err)
			}
		}
		if rt.scopes.lookup("api").hedge.Ties().Speaks() {
			t.Fatal("a server whose 1xx answers are not the start signal is taken to speak ties")
		}
		mode.Store(1)
		failed := 0
		for i := range 10 {
			if _, err := laneGet(t, rt, "http://api/", "flood"+strconv.Itoa(i)); err != nil {
				if !errors.Is(err, errTooManyInformational) {
					t.Errorf("call %d: %v, want %v", i, err, errTooManyInformational)
				}
				failed++
			}
		}
		if failed == 0 {
			t.Error("no call failed against a flood of 1xx answers on its marked first leg")
		}
		time.Sleep(time.Second) // the handlers of the failed attempts end
		synctest.Wait()
	})
}
