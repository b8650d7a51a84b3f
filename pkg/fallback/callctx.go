package fallback

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

// callCtx is the context a Store hands to the next store: the caller's context with the
// per-call deadline (Config.Timeout, or ProbeTimeout for a probe), read from the injected
// clock.
//
// context.WithTimeout would cost a clock read, a timer, a channel and three allocations on
// every check (≈ 1.4 µs on the shared test machines), although a next store answering from
// memory (a leased token) never looks at its context. callCtx is one small allocation and
// nothing more until the next store looks: the deadline is fixed (Timeout from now) the
// first time Deadline, Done or Err is called, and the channel, the timer and the link to the
// parent's cancellation are made on the first Done or Err — which a store doing I/O calls
// before its first round trip (go-redis does). So the deadline is Timeout after the next
// store first looks at its context, later than the call's start by the in-memory work done
// before that: it errs late by microseconds, never early.
//
// It honours the context contract: Done closes at the deadline or when the parent is done,
// whichever is first; Err is nil until then; after release (the call returned) it is
// cancelled, like a WithTimeout context after cancel(), so a next store that kept it finds
// it done rather than reused.
type callCtx struct {
	mu         sync.Mutex    // mu guards started, deadline, done, err, released, stopTimer, stopParent
	timeout    time.Duration // the call's deadline, from when next first looks; set before the call
	started    bool
	start      time.Time // when next first looked: the start of its round trip
	deadline   time.Time
	done       chan struct{}
	err        error
	released   bool
	stopTimer  func()
	stopParent func() bool
	parent     context.Context
	s          *Store // for the clock and the timeouts
}

func newCallCtx(parent context.Context, s *Store, timeout time.Duration) *callCtx {
	return &callCtx{parent: parent, s: s, timeout: timeout}
}

// startLocked fixes the deadline on first use. Called with c.mu held.
func (c *callCtx) startLocked() {
	if !c.started {
		c.started = true
		c.start = c.s.clock.Now()
		c.deadline = c.start.Add(c.timeout)
	}
}

// Deadline returns the earlier of the parent's deadline and the call's.
func (c *callCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	c.startLocked()
	dl := c.deadline
	c.mu.Unlock()
	if d, ok := c.parent.Deadline(); ok && d.Before(dl) {
		return d, true
	}
	return dl, true
}

// Done returns a channel closed at the deadline, when the parent is done, or on release.
func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	if c.done == nil {
		c.armLocked()
	}
	d := c.done
	c.mu.Unlock()
	return d
}

// Err returns nil until Done is closed, then why it was.
func (c *callCtx) Err() error {
	c.mu.Lock()
	if c.done == nil {
		c.armLocked()
	}
	err := c.err
	c.mu.Unlock()
	return err
}

// Value returns the parent's values.
func (c *callCtx) Value(key any) any { return c.parent.Value(key) }

// armLocked makes the channel and starts watching the deadline and the parent. Called with
// c.mu held; the callbacks it registers run on other goroutines and take c.mu themselves.
func (c *callCtx) armLocked() {
	c.done = make(chan struct{})
	c.startLocked()
	if c.released {
		c.finishLocked(context.Canceled)
		return
	}
	if err := c.parent.Err(); err != nil {
		c.finishLocked(err)
		return
	}
	d := c.deadline.Sub(c.s.clock.Now())
	if d <= 0 {
		c.finishLocked(context.DeadlineExceeded)
		return
	}
	c.stopTimer = afterFunc(c.s.clock, c.s.clockIsReal, d, func() { c.cancel(context.DeadlineExceeded) })
	if c.parent.Done() != nil {
		c.stopParent = context.AfterFunc(c.parent, func() { c.cancel(c.parent.Err()) })
	}
}

func (c *callCtx) cancel(err error) {
	c.mu.Lock()
	c.finishLocked(err)
	c.mu.Unlock()
}

func (c *callCtx) finishLocked(err error) {
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// release ends the call: the context is cancelled (if anyone is watching it) and its timer
// and parent link are stopped, waiting for a fake-clock timer goroutine to exit. It returns
// when next first looked at the context (zero if it never did: no round trip).
func (c *callCtx) release() (start time.Time) {
	c.mu.Lock()
	c.released = true
	start = c.start
	if c.done != nil {
		c.finishLocked(context.Canceled)
	}
	stopTimer, stopParent := c.stopTimer, c.stopParent
	c.stopTimer, c.stopParent = nil, nil
	c.mu.Unlock()
	if stopTimer != nil {
		stopTimer()
	}
	if stopParent != nil {
		stopParent()
	}
	return start
}

// isReal reports whether c is clock.Real(), whose timers can be plain time.AfterFunc.
// Comparing types, not values, cannot panic on a Clock of an incomparable type.
func isReal(c clock.Clock) bool { return reflect.TypeOf(c) == reflect.TypeOf(clock.Real()) }

// afterFunc calls f on its own goroutine after d on clock c, unless stop is called first.
// With the real clock it is time.AfterFunc. With any other clock (a fake in tests) only
// NewTimer is available, so one goroutine waits on the timer; stop ends it and waits for
// it, so no goroutine outlives the call.
func afterFunc(c clock.Clock, real bool, d time.Duration, f func()) (stop func()) {
	if real {
		t := time.AfterFunc(d, f)
		return func() { t.Stop() }
	}
	t := c.NewTimer(d)
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-t.C():
			f()
		case <-quit:
			t.Stop()
		}
	}()
	return func() {
		close(quit)
		<-exited
	}
}
