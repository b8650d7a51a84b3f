package fallback

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
)

// mode is how the fake next store answers for one shard.
type mode int

const (
	healthy mode = iota // grants Want, Source redis
	down                // fails at once with errDown
	hang                // waits for ctx.Done and returns ctx.Err()
	invalid             // returns an error wrapping bucket.ErrInvalid
	hold                // waits for release (then grants) or ctx.Done
	leased              // grants Want from "leased tokens": Source lease, no shard involved
	late                // grants Want after fakeNext.delay on the fake clock (or fails at ctx.Done)
)

var errDown = errors.New("fake: connection refused")

// fakeNext is a next store that fails on command, per identity or else per shard (the
// identity's prefix before ':'). It counts calls per shard and reports calls that wait on entered.
type fakeNext struct {
	mu      sync.Mutex // mu guards modes and calls
	modes   map[string]mode
	calls   map[string]int
	entered chan *bucket.Request // a hang/hold call has started waiting
	release chan struct{}        // a hold call may answer
	lastCtx context.Context
	clk     *clock.Fake   // for late
	delay   time.Duration // for late
}

func newFakeNext() *fakeNext {
	return &fakeNext{
		modes:   map[string]mode{},
		calls:   map[string]int{},
		entered: make(chan *bucket.Request, 64),
		release: make(chan struct{}),
	}
}

func shardOf(identity string) string {
	if i := strings.IndexByte(identity, ':'); i >= 0 {
		return identity[:i]
	}
	return identity
}

// set sets the mode of a shard ("a") or of one identity ("a:k").
func (f *fakeNext) set(shardOrIdentity string, m mode) {
	f.mu.Lock()
	f.modes[shardOrIdentity] = m
	f.mu.Unlock()
}

func (f *fakeNext) callsTo(shard string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[shard]
}

func (f *fakeNext) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	if err := req.Validate(); err != nil {
		return bucket.Result{}, err
	}
	shard := shardOf(req.Identity)
	f.mu.Lock()
	m, ok := f.modes[req.Identity]
	if !ok {
		m = f.modes[shard]
	}
	f.calls[shard]++
	f.lastCtx = ctx
	f.mu.Unlock()
	switch m {
	case down:
		return bucket.Result{}, fmt.Errorf("while taking %q: %w", req.Identity, errDown)
	case invalid:
		return bucket.Result{}, fmt.Errorf("%w: fake says no", bucket.ErrInvalid)
	case hang:
		done := ctx.Done()
		f.entered <- req
		<-done
		return bucket.Result{}, ctx.Err()
	case hold:
		done := ctx.Done()
		f.entered <- req
		select {
		case <-f.release:
		case <-done:
			return bucket.Result{}, ctx.Err()
		}
	case leased:
		return bucket.Result{Granted: req.Want, Remaining: 1, Source: bucket.SourceLease}, nil
	case late:
		tm := f.clk.NewTimer(f.delay)
		defer tm.Stop()
		f.entered <- req
		select {
		case <-tm.C():
		case <-ctx.Done():
			return bucket.Result{}, ctx.Err()
		}
	}
	return bucket.Result{Granted: req.Want, Remaining: 1, Source: bucket.SourceRedis}, nil
}

// recorder is an Observer that remembers everything.
type recorder struct {
	mu          sync.Mutex // mu guards all below
	transitions []string
	failures    int
	decisions   map[bucket.Source]int
	locals      map[local]int
}

// local is one shard and reason of Observer.Local.
type local struct {
	shard string
	why   LocalReason
}

func (r *recorder) Local(shard string, why LocalReason) {
	r.mu.Lock()
	if r.locals == nil {
		r.locals = map[local]int{}
	}
	r.locals[local{shard, why}]++
	r.mu.Unlock()
}

func (r *recorder) Transition(shard string, from, to State) {
	r.mu.Lock()
	r.transitions = append(r.transitions, fmt.Sprintf("%s:%v->%v", shard, from, to))
	r.mu.Unlock()
}

func (r *recorder) Failure(string, error) {
	r.mu.Lock()
	r.failures++
	r.mu.Unlock()
}

func (r *recorder) Decision(_ string, src bucket.Source, _ bool) {
	r.mu.Lock()
	if r.decisions == nil {
		r.decisions = map[bucket.Source]int{}
	}
	r.decisions[src]++
	r.mu.Unlock()
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.transitions...)
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex // mu guards b
	b   bytes.Buffer
	tee testing.TB
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tee.Log(strings.TrimSpace(string(p)))
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type harness struct {
	s    *Store
	next *fakeNext
	clk  *clock.Fake
	obs  *recorder
	logs *syncBuffer
}

// newHarness builds a Store over a fakeNext, sharded by identity prefix, on a fake clock,
// with config changes applied by edit.
func newHarness(t *testing.T, edit func(*Config)) *harness {
	t.Helper()
	h := &harness{next: newFakeNext(), clk: clock.NewFake(t0), obs: &recorder{}, logs: &syncBuffer{tee: t}}
	h.next.clk = h.clk
	cfg := DefaultConfig()
	cfg.Clock = h.clk
	cfg.Shard = shardOf
	cfg.Observer = h.obs
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: h.logs, Level: hclog.Info})
	// Most tests here judge one shard alone, with no other shard answering: they get the
	// per-shard rule (a missing reply on time trips) by letting any silence of every shard
	// count once it is ReplyTimeout old. The cross-shard rule is tested at its default in
	// silence_test.go.
	cfg.AllSilentFor = cfg.ReplyTimeout
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(h.next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	t.Cleanup(func() { s.Close() })
	return h
}

func req(identity string, rate, burst float64) *bucket.Request {
	return &bucket.Request{Identity: identity, Limits: []bucket.Limit{{Name: "r", Rate: rate, Burst: burst}}, Want: 1}
}

func (h *harness) take(t *testing.T, r *bucket.Request) bucket.Result {
	t.Helper()
	res, err := h.s.Take(context.Background(), r)
	if err != nil {
		t.Fatalf("Take(%q): %v", r.Identity, err)
	}
	return res
}

// trip opens shard's breaker with TripAfter failing checks on a throwaway identity.
func (h *harness) trip(t *testing.T, shard string) {
	t.Helper()
	h.next.set(shard, down)
	for i := 0; i < h.s.cfg.TripAfter; i++ {
		h.take(t, req(shard+":tripper", 1, 1))
	}
	if st := h.s.State(shard); st != Open {
		t.Fatalf("after %d failures shard %q is %v, want open", h.s.cfg.TripAfter, shard, st)
	}
}

// waitEntered waits (bounded) for a hang/hold call to reach the fake next store.
func (h *harness) waitEntered(t *testing.T) *bucket.Request {
	t.Helper()
	select {
	case r := <-h.next.entered:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the next store within 10s")
		return nil
	}
}

type outcomeOf struct {
	res bucket.Result
	err error
}

// takeAsync runs one check on its own goroutine.
func (h *harness) takeAsync(r *bucket.Request) <-chan outcomeOf {
	done := make(chan outcomeOf, 1)
	go func() {
		res, err := h.s.Take(context.Background(), r)
		done <- outcomeOf{res, err}
	}()
	return done
}

// advanceUntilAnswered advances the fake clock one Timeout at a time until every check of
// outs has answered (each waits again, one Timeout at a time, while its shard is not yet
// silent for ReplyTimeout/2), at most ReplyTimeout; calls is the number of call deadlines
// pending meanwhile. It returns the outcomes and how far the clock moved.
func (h *harness) advanceUntilAnswered(t *testing.T, calls int, outs ...<-chan outcomeOf) ([]outcomeOf, time.Duration) {
	t.Helper()
	got := make([]outcomeOf, len(outs))
	seen := make([]bool, len(outs))
	var moved time.Duration
	for {
		pending := 0
		h.eventually(t, "every waiting check re-armed its wait or answered", func() bool {
			pending = 0
			for i, out := range outs {
				if !seen[i] && len(out) == 0 {
					pending++
				}
			}
			return pending == 0 || h.clk.Timers() >= calls+pending
		})
		for i, out := range outs {
			if !seen[i] && len(out) > 0 {
				got[i], seen[i] = <-out, true
			}
		}
		if pending == 0 {
			return got, moved
		}
		if moved >= h.s.cfg.ReplyTimeout {
			t.Fatalf("%d checks still waiting after %v", pending, moved)
		}
		h.clk.Advance(h.s.cfg.Timeout)
		moved += h.s.cfg.Timeout
	}
}

// waitTimers waits (bounded, yielding) until the fake clock holds at least n timers: the
// waits and deadlines a test is about to Advance past.
func (h *harness) waitTimers(t *testing.T, n int) {
	t.Helper()
	h.eventually(t, fmt.Sprintf("%d timers on the fake clock", n), func() bool { return h.clk.Timers() >= n })
}

// eventually yields until cond holds, failing after 10 s of real time: the goroutines of
// calls finish asynchronously after the fake clock moves.
func (h *harness) eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	limit := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(limit) {
			t.Fatalf("%s: not within 10s", what)
		}
		runtime.Gosched()
	}
}

func (r *recorder) failureCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures
}

// prime has shard answer one call and lets ReplyTimeout pass: the shard is known (it has
// answered) but not fresh, so a check whose wait passes is answered locally at Timeout.
func (h *harness) prime(t *testing.T, shard string) {
	t.Helper()
	h.next.mu.Lock()
	m, had := h.next.modes[shard]
	h.next.mu.Unlock()
	h.next.set(shard, healthy)
	if res := h.take(t, req(shard+":prime", 1e6, 1e6)); res.Source != bucket.SourceRedis {
		t.Fatalf("priming %s: %v", shard, res.Source)
	}
	if had {
		h.next.set(shard, m)
	}
	h.clk.Advance(h.s.cfg.ReplyTimeout)
}
