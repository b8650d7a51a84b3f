package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Timeout = 0 }, "Timeout 0s"},
		{func(c *Config) { c.Timeout = -time.Millisecond }, "Timeout -1ms"},
		{func(c *Config) { c.ProbeTimeout = 0 }, "ProbeTimeout 0s"},
		{func(c *Config) { c.TripAfter = 0 }, "TripAfter 0"},
		{func(c *Config) { c.OpenFor = 0 }, "OpenFor 0s"},
		{func(c *Config) { c.ReplyTimeout = time.Millisecond }, "ReplyTimeout 1ms"},
		{func(c *Config) { c.ReplyTimeout = -time.Millisecond }, "ReplyTimeout -1ms"},
		{func(c *Config) { c.MaxInFlight = 0 }, "MaxInFlight 0"},
		{func(c *Config) { c.OpenFor = -time.Second }, "OpenFor -1s"},
		{func(c *Config) { c.Slack = 0 }, "Slack 0"},
		{func(c *Config) { c.Slack = -1 }, "Slack -1"},
		{func(c *Config) { c.Slack = nan() }, "Slack NaN"},
		{func(c *Config) { c.MaxLocalKeys = 0 }, "MaxLocalKeys 0"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an error naming %q", err, tc.want)
		}
		if _, err := New(newFakeNext(), c); err == nil {
			t.Errorf("New accepted a config with %s", tc.want)
		}
	}
	if _, err := New(newFakeNext(), Config{}); err == nil || !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("New(zero Config) = %v, want an error naming Timeout", err)
	}
	if _, err := New(nil, DefaultConfig()); err == nil {
		t.Error("New(nil next) succeeded")
	}
}

func nan() float64 { z := 0.0; return z / z }

func TestTripsAfterExactlyTripAfterFailures(t *testing.T) {
	for _, trip := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(trip), func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.TripAfter = trip })
			h.next.set("a", down)
			for i := 1; i <= trip; i++ {
				res := h.take(t, req("a:k", 100, 100))
				if res.Source != bucket.SourceFallback || res.Granted != 1 {
					t.Fatalf("failure %d answered %+v, want granted locally", i, res)
				}
				want := Closed
				if i == trip {
					want = Open
				}
				if st := h.s.State("a"); st != want {
					t.Fatalf("after %d failures: %v, want %v", i, st, want)
				}
			}
			for i := 0; i < 10; i++ {
				h.take(t, req("a:k", 100, 100))
			}
			if n := h.next.callsTo("a"); n != trip {
				t.Fatalf("next was called %d times, want %d (none once open)", n, trip)
			}
		})
	}
}

func TestSuccessResetsFailureCount(t *testing.T) {
	h := newHarness(t, nil) // TripAfter 5
	for round := 0; round < 3; round++ {
		h.next.set("a", down)
		for i := 0; i < 4; i++ {
			h.take(t, req("a:k", 100, 100))
		}
		h.next.set("a", healthy)
		if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceRedis {
			t.Fatalf("healthy call answered from %v", res.Source)
		}
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("4 failures between successes opened the breaker: %v", st)
	}
}

// TestCachedSuccessesDoNotHideFailures: a key answered from leased tokens keeps succeeding
// while its shard is dead; those successes must not reset the count of the keys that fail.
func TestCachedSuccessesDoNotHideFailures(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", down)
	h.next.set("a:leased", leased)
	for i := 1; i <= DefaultTripAfter; i++ {
		if res := h.take(t, req("a:leased", 100, 100)); res.Source != bucket.SourceLease {
			t.Fatalf("leased key answered from %v", res.Source)
		}
		h.take(t, req("a:k", 100, 100))
	}
	if st := h.s.State("a"); st != Open {
		t.Fatalf("%d failures between lease hits: %v, want open", DefaultTripAfter, st)
	}
}

// TestProbeAnsweredFromCacheIsInconclusive: a probe answered by a cache below did not reach
// the shard, so the breaker stays open and the next check probes.
func TestProbeAnsweredFromCacheIsInconclusive(t *testing.T) {
	h := newHarness(t, nil)
	h.trip(t, "a")
	h.next.set("a:leased", leased)
	h.clk.Advance(DefaultOpenFor)
	if res := h.take(t, req("a:leased", 100, 100)); res.Source != bucket.SourceLease || res.Granted != 1 {
		t.Fatalf("probe answered from a lease: %+v, want the lease's answer", res)
	}
	if st := h.s.State("a"); st != Open {
		t.Fatalf("after a probe answered from a lease: %v, want open", st)
	}
	calls := h.next.callsTo("a")
	h.next.set("a", healthy)
	if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("next check: source %v, want a probe answered by redis", res.Source)
	}
	if h.next.callsTo("a") != calls+1 || h.s.State("a") != Closed {
		t.Fatalf("the next check did not probe and close the breaker: %v", h.s.State("a"))
	}
}

// TestOpenForThenProbe: a breaker opened from closed probes after FirstOpenFor; each
// failed probe doubles the wait up to OpenFor; no check calls the shard in between.
func TestOpenForThenProbe(t *testing.T) {
	h := newHarness(t, nil)
	h.trip(t, "a")
	calls := h.next.callsTo("a")
	for i, wait := range []time.Duration{DefaultFirstOpenFor, 2 * DefaultFirstOpenFor, 4 * DefaultFirstOpenFor, DefaultOpenFor, DefaultOpenFor} {
		h.clk.Advance(wait - time.Microsecond)
		if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceFallback {
			t.Fatalf("wait %d: 1µs before %v: source %v", i, wait, res.Source)
		}
		if n := h.next.callsTo("a"); n != calls {
			t.Fatalf("wait %d: next called %d times before %v passed", i, n-calls, wait)
		}
		// The probe fails: open again, for twice as long (at most OpenFor).
		h.clk.Advance(time.Microsecond)
		if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceFallback {
			t.Fatalf("failed probe answered from %v", res.Source)
		}
		calls++
		if n := h.next.callsTo("a"); n != calls {
			t.Fatalf("wait %d: next called %d times at %v, want exactly 1 probe", i, n-calls+1, wait)
		}
		if st := h.s.State("a"); st != Open {
			t.Fatalf("after a failed probe: %v, want open", st)
		}
	}
}

// TestReopenSoonBacksOff: a shard that fails again soon after a probe closed its breaker
// starts from double its last wait; one that stayed closed for OpenFor starts afresh.
func TestReopenSoonBacksOff(t *testing.T) {
	h := newHarness(t, nil)
	h.trip(t, "a")
	h.next.set("a", healthy)
	h.clk.Advance(DefaultFirstOpenFor)
	h.take(t, req("a:k", 100, 100)) // the probe closes it
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("after a good probe: %v", st)
	}
	h.trip(t, "a") // again at once
	h.clk.Advance(2*DefaultFirstOpenFor - time.Microsecond)
	calls := h.next.callsTo("a")
	h.take(t, req("a:k", 100, 100))
	if h.next.callsTo("a") != calls {
		t.Fatal("reopened soon after closing: probed before twice the first wait")
	}
	h.next.set("a", healthy)
	h.clk.Advance(time.Microsecond)
	h.take(t, req("a:k", 100, 100))
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("probe at twice the first wait: %v, want closed", st)
	}
	h.clk.Advance(DefaultOpenFor) // closed a whole OpenFor
	h.trip(t, "a")
	h.next.set("a", healthy)
	h.clk.Advance(DefaultFirstOpenFor)
	h.take(t, req("a:k", 100, 100))
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("opened long after closing: no probe at FirstOpenFor: %v", st)
	}
}

// TestProbeClosesAfterFailures: once the shard is back, the next probe closes the
// breaker and checks are answered by the shard again.
func TestProbeClosesAfterFailures(t *testing.T) {
	h := newHarness(t, nil)
	h.trip(t, "a")
	h.clk.Advance(DefaultFirstOpenFor)
	h.take(t, req("a:k", 100, 100)) // a failed probe: open for 2 × FirstOpenFor
	calls := h.next.callsTo("a")
	h.clk.Advance(2*DefaultFirstOpenFor - time.Microsecond)
	h.take(t, req("a:k", 100, 100))
	if n := h.next.callsTo("a"); n != calls {
		t.Fatal("a re-opened breaker was probed before its doubled wait passed")
	}

	// The shard is back: the next probe closes the breaker and answers from next.
	h.next.set("a", healthy)
	h.clk.Advance(time.Microsecond)
	if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("successful probe answered from %v", res.Source)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("after a successful probe: %v, want closed", st)
	}
	if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("closed breaker answered from %v", res.Source)
	}
}

func TestExactlyOneProbeUnderConcurrency(t *testing.T) {
	h := newHarness(t, nil)
	for round := 0; round < 20; round++ {
		h.trip(t, "a")
		h.next.set("a", hold)
		h.clk.Advance(DefaultOpenFor)
		calls := h.next.callsTo("a")

		const n = 50
		// Every check reaches the point where it sees the probe is due before any claims it.
		var lineUp sync.WaitGroup
		lineUp.Add(n)
		testHookProbeRace = func() { lineUp.Done(); lineUp.Wait() }
		start := make(chan struct{})
		results := make(chan bucket.Result, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, err := h.s.Take(context.Background(), req(fmt.Sprintf("a:k%d", i), 100, 100))
				if err != nil {
					t.Error(err)
				}
				results <- res
			}()
		}
		close(start)
		h.waitEntered(t)
		for i := 0; i < n-1; i++ {
			select {
			case res := <-results:
				if res.Source != bucket.SourceFallback {
					t.Errorf("a check during the probe answered from %v", res.Source)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: only %d of %d checks answered while one probe is held; %d calls reached next",
					round, i, n-1, h.next.callsTo("a")-calls)
			}
		}
		if st := h.s.State("a"); st != HalfOpen {
			t.Errorf("during the probe: %v, want half-open", st)
		}
		if got := h.next.callsTo("a") - calls; got != 1 {
			t.Errorf("%d calls reached next in half-open, want exactly 1", got)
		}
		h.next.release <- struct{}{}
		wg.Wait()
		testHookProbeRace = nil
		if res := <-results; res.Source != bucket.SourceRedis {
			t.Errorf("the probe answered from %v", res.Source)
		}
		if st := h.s.State("a"); st != Closed {
			t.Fatalf("after the probe: %v, want closed", st)
		}
	}
}

func TestOneShardDoesNotAffectAnother(t *testing.T) {
	h := newHarness(t, nil)
	h.trip(t, "a")
	for i := 0; i < 100; i++ {
		if res := h.take(t, req(fmt.Sprintf("b:k%d", i%7), 1000, 1000)); res.Source != bucket.SourceRedis {
			t.Fatalf("shard b answered from %v while shard a is down", res.Source)
		}
		if res := h.take(t, req(fmt.Sprintf("a:k%d", i%7), 1000, 1000)); res.Source != bucket.SourceFallback {
			t.Fatalf("shard a answered from %v while down", res.Source)
		}
	}
	if st := h.s.State("b"); st != Closed {
		t.Fatalf("shard b: %v", st)
	}
	want := map[string]State{"a": Open, "b": Closed}
	if got := h.s.States(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("States() = %v, want %v", got, want)
	}
}

// TestLocalLimits offers a key at 100/s on a fake timeline while its shard is down and
// checks the admitted count against limit × Slack / N: burst' + rate' × elapsed.
func TestErrInvalidDoesNotTrip(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", invalid)
	for i := 0; i < 3*DefaultTripAfter; i++ {
		if _, err := h.s.Take(context.Background(), req("a:k", 1, 1)); !errors.Is(err, bucket.ErrInvalid) {
			t.Fatalf("Take = %v, want ErrInvalid passed through", err)
		}
		bad := req("a:k", -1, 1) // the fake validates like every store
		if _, err := h.s.Take(context.Background(), bad); !errors.Is(err, bucket.ErrInvalid) {
			t.Fatalf("Take(rate -1) = %v, want ErrInvalid", err)
		}
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("ErrInvalid opened the breaker: %v", st)
	}
	// Invalid requests are refused as such while open too, not answered locally.
	h.trip(t, "a")
	if _, err := h.s.Take(context.Background(), req("a:k", 1, 0)); !errors.Is(err, bucket.ErrInvalid) {
		t.Fatalf("open, burst 0: %v, want ErrInvalid", err)
	}
	if h.obs.failureCount() != DefaultTripAfter {
		t.Fatalf("observer saw %d failures, want %d", h.obs.failureCount(), DefaultTripAfter)
	}
}

func TestCallerCancellationDoesNotTrip(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", hang)

	// Cancelled before the call.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 2*DefaultTripAfter; i++ {
		if _, err := h.s.Take(ctx, req("a:k", 1, 1)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Take = %v, want context.Canceled", err)
		}
		h.waitEntered(t)
	}
	// Cancelled while the call waits on the shard.
	for i := 0; i < 2*DefaultTripAfter; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := h.s.Take(ctx, req("a:k", 1, 1))
			errc <- err
		}()
		h.waitEntered(t)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Take = %v, want context.Canceled", err)
		}
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("the caller's cancellations opened the breaker: %v", st)
	}
	if h.obs.failureCount() != 0 {
		t.Fatalf("observer counted %d failures", h.obs.failureCount())
	}
}

// TestMissingReplyTrips: a call that hangs on an idle shard is given up by its check once
// the shard has been silent for ReplyTimeout/2 since it was given the call (answered
// locally, the breaker untouched), and goes on until ReplyTimeout, when its missing reply
// opens the breaker.
func TestMissingReplyTrips(t *testing.T) {
	h := newHarness(t, nil)
	h.prime(t, "a")
	h.next.set("a", hang)
	done := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2) // the check's wait and the call's deadline
	h.clk.Advance(DefaultTimeout - time.Microsecond)
	select {
	case <-done:
		t.Fatal("the check stopped waiting before Timeout")
	default:
	}
	h.clk.Advance(time.Microsecond)
	outs, moved := h.advanceUntilAnswered(t, 1, done)
	moved += DefaultTimeout
	if o := outs[0]; o.err != nil || o.res.Source != bucket.SourceFallback {
		t.Fatalf("check past its wait: %+v, %v; want answered locally", o.res, o.err)
	}
	if half := DefaultReplyTimeout / 2; moved <= half || moved > half+DefaultTimeout {
		t.Fatalf("answered locally after %v, want once the shard was silent over %v since the call", moved, half)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("a check's wait opened the breaker: %v", st)
	}
	h.clk.Advance(DefaultReplyTimeout - moved - time.Microsecond)
	if st := h.s.State("a"); st != Closed || h.obs.failureCount() != 0 {
		t.Fatalf("before ReplyTimeout: %v, %d failures", st, h.obs.failureCount())
	}
	h.clk.Advance(time.Microsecond)
	h.eventually(t, "breaker open at ReplyTimeout", func() bool { return h.s.State("a") == Open })
	if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceFallback {
		t.Fatalf("open: %v", res.Source)
	}
}

// TestProbeHasProbeTimeout: the probe's deadline is ProbeTimeout; a probe that misses it
// counts as a failure and re-opens the breaker.
func TestProbeHasProbeTimeout(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ProbeTimeout = 300 * time.Millisecond })
	h.prime(t, "a")
	h.trip(t, "a")
	h.next.set("a", hang)
	h.clk.Advance(DefaultOpenFor)
	done := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	outs, moved := h.advanceUntilAnswered(t, 1, done)
	if o := outs[0]; o.res.Source != bucket.SourceFallback {
		t.Fatalf("probing check past its wait answered from %v", o.res.Source)
	}
	h.clk.Advance(DefaultReplyTimeout - moved)
	if st := h.s.State("a"); st != HalfOpen {
		t.Fatalf("probe ended at ReplyTimeout, not ProbeTimeout: %v", st)
	}
	h.clk.Advance(300*time.Millisecond - DefaultReplyTimeout)
	h.eventually(t, "breaker open again after the probe's missing reply", func() bool { return h.s.State("a") == Open })
}

func TestTransitionsReportedOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", down)
	// Many concurrent failures: one transition to open.
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if _, err := h.s.Take(context.Background(), req(fmt.Sprintf("a:k%d", i), 10, 10)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	h.clk.Advance(DefaultOpenFor) // probe fails
	for i := 0; i < 10; i++ {
		h.take(t, req("a:k", 10, 10))
	}
	h.next.set("a", healthy)
	h.clk.Advance(DefaultOpenFor) // probe succeeds
	for i := 0; i < 10; i++ {
		h.take(t, req("a:k", 10, 10))
	}
	want := []string{"a:closed->open", "a:open->half-open", "a:half-open->open", "a:open->half-open", "a:half-open->closed"}
	if got := h.obs.seen(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("transitions %v, want %v", got, want)
	}
	lines := h.logs.lines()
	if len(lines) != len(want) {
		t.Fatalf("%d log lines, want one per transition (%d):\n%s", len(lines), len(want), strings.Join(lines, "\n"))
	}
	if !strings.Contains(lines[0], "shard=a") || !strings.Contains(lines[0], "open-for=250ms") {
		t.Fatalf("opening line lacks kebab-case keys: %s", lines[0])
	}
}

func TestBreakerTableIsBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Shard = func(id string) string { return id } })
	for i := 0; i < maxBreakers+500; i++ {
		h.take(t, req(fmt.Sprint(i), 1, 1))
	}
	if n := len(*h.s.breakers.Load()); n != maxBreakers {
		t.Fatalf("breaker table holds %d shards, want the bound %d", n, maxBreakers)
	}
}

func TestOneShardWhenShardIsNil(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Shard = nil })
	h.next.set("a", down)
	for i := 0; i < DefaultTripAfter; i++ {
		h.take(t, req("a:k", 10, 10))
	}
	if st := h.s.State("anything"); st != Open {
		t.Fatalf("single breaker: %v, want open", st)
	}
	if res := h.take(t, req("b:k", 10, 10)); res.Source != bucket.SourceFallback {
		t.Fatalf("with one shard every key degrades: %v", res.Source)
	}
}

func TestClose(t *testing.T) {
	h := newHarness(t, nil)
	if err := h.s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := h.s.Take(context.Background(), req("a:k", 1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after Close = %v, want ErrClosed", err)
	}
}

// TestCachedPathAllocations pins the hot path's cost: a check the next store answers
// from memory (Cache) allocates nothing and starts nothing.
func TestCachedPathAllocations(t *testing.T) {
	s, err := New(trivialNext{}, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := req("a:k", 1e6, 1e6)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if res, err := s.Take(ctx, r); err != nil || res.Source != bucket.SourceLease {
			t.Fatal(res, err)
		}
	})
	if allocs > 0 {
		t.Fatalf("cached path: %v allocations per check, want 0", allocs)
	}
}

// TestOpenPathAllocations: while a shard is down every one of its checks is answered
// locally, so that path must not allocate either.

// cachingNext is a fakeNext that also answers from memory (a Cache) the identities set
// to leased, as pkg/lease does.
type cachingNext struct{ *fakeNext }

func (c cachingNext) TakeCached(req *bucket.Request) (bucket.Result, bool) {
	c.mu.Lock()
	m := c.modes[req.Identity]
	c.mu.Unlock()
	if m != leased {
		return bucket.Result{}, false
	}
	return bucket.Result{Granted: req.Want, Source: bucket.SourceLease}, true
}

// quietObserver counts transitions only and says so (DecisionsIgnored).
type quietObserver struct{ NopObserver }

func (quietObserver) DecisionsIgnored() {}

// TestCachedAnswersSkipTheShardLookup: while every breaker is closed, an answer from
// memory looks up no shard (unless the Observer wants decisions); once a shard's breaker
// opens, its keys are answered locally, leased or not, as before, and another shard's
// leased keys still from memory; when the probe closes it, lookups stop again.
func TestCachedAnswersSkipTheShardLookup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		obs     Observer
		lookups bool // a cached answer looks up its shard while all are closed
	}{{"decisions ignored", quietObserver{}, false}, {"decisions observed", &recorder{}, true}, {"no observer", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			next := cachingNext{newFakeNext()}
			clk := clock.NewFake(t0)
			next.clk = clk
			var lookups atomic.Int32
			cfg := DefaultConfig()
			cfg.Clock, cfg.Observer, cfg.AllSilentFor = clk, tc.obs, cfg.ReplyTimeout
			cfg.Shard = func(id string) string { lookups.Add(1); return shardOf(id) }
			s, err := New(next, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			take := func(id string) bucket.Result {
				t.Helper()
				res, err := s.Take(context.Background(), req(id, 100, 100))
				if err != nil {
					t.Fatalf("Take(%q): %v", id, err)
				}
				return res
			}
			next.set("a:leased", leased)
			next.set("b:leased", leased)
			lookups.Store(0)
			if res := take("a:leased"); res.Source != bucket.SourceLease {
				t.Fatalf("closed: leased key from %v", res.Source)
			}
			if got := lookups.Load() > 0; got != tc.lookups {
				t.Fatalf("closed: %d shard lookups for an answer from memory", lookups.Load())
			}
			if res := take("a:k"); res.Source != bucket.SourceRedis || lookups.Load() == 0 {
				t.Fatalf("closed: a call to the shard from %v after %d lookups", res.Source, lookups.Load())
			}

			next.set("a", down)
			for range cfg.TripAfter {
				take("a:tripper")
			}
			if st := s.State("a"); st != Open {
				t.Fatalf("after %d failures: %v, want open", cfg.TripAfter, st)
			}
			if res := take("a:leased"); res.Source != bucket.SourceFallback {
				t.Fatalf("open: a leased key of the open shard from %v, want fallback", res.Source)
			}
			if res := take("b:leased"); res.Source != bucket.SourceLease {
				t.Fatalf("open: a leased key of a closed shard from %v", res.Source)
			}

			next.set("a", healthy)
			clk.Advance(cfg.OpenFor)
			if res := take("a:k"); res.Source != bucket.SourceRedis || s.State("a") != Closed {
				t.Fatalf("probe: %v, breaker %v; want redis, closed", res.Source, s.State("a"))
			}
			lookups.Store(0)
			take("a:leased")
			if got := lookups.Load() > 0; got != tc.lookups {
				t.Fatalf("closed again: %d shard lookups for an answer from memory", lookups.Load())
			}
		})
	}
}
