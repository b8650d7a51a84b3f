package fallback

import (
	"context"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

// The clocks of a check's wait and of a call's life: a check waits on a timer (newTimer: a
// pooled runtime timer, or the Store's clock's), and a call runs under a deadline
// (callContext: a context deadline go-redis puts on the socket, or a timer of the Store's
// clock that cancels the call). Stalls of this process: meter.go.

// callContext is the context of one call: the Store's (cancelled by Close) with the
// call's deadline, d after sent. With the real clock it is a context deadline, which
// go-redis puts on the socket. With another clock (a fake in tests) the deadline is a
// timer of that clock that cancels the context, and the context carries no Deadline.
// expired reports whether the deadline has passed; stop releases the context.
func (s *Store) callContext(sent int64, d time.Duration) (ctx context.Context, expired func() bool, stop func()) {
	if s.real {
		dl := time.UnixMicro(sent).Add(d)
		ctx, cancel := context.WithDeadline(s.ctx, dl)
		return ctx, func() bool { return !time.Now().Before(dl) }, cancel
	}
	ctx, cancel := context.WithCancel(s.ctx)
	var exp atomic.Bool
	left := d - time.Duration(s.clock.Now().UnixMicro()-sent)*time.Microsecond
	stopTimer := afterFunc(s.clock, left, func() { exp.Store(true); cancel() })
	return ctx, exp.Load, func() { stopTimer(); cancel() }
}

// timer is a check's wait: a pooled runtime timer with the real clock, else a timer of
// the Store's clock.
type timer struct {
	rt *time.Timer
	ft clock.Timer
}

func (s *Store) newTimer(d time.Duration) timer {
	if !s.real {
		return timer{ft: s.clock.NewTimer(d)}
	}
	if t, ok := s.timers.Get().(*time.Timer); ok {
		t.Reset(d)
		return timer{rt: t}
	}
	return timer{rt: time.NewTimer(d)}
}

func (t timer) c() <-chan time.Time {
	if t.rt != nil {
		return t.rt.C
	}
	return t.ft.C()
}

// stopTimer stops t (after Stop a runtime timer delivers nothing stale: Go ≥ 1.23) and
// pools a runtime one.
func (s *Store) stopTimer(t timer) {
	if t.rt == nil {
		t.ft.Stop()
		return
	}
	t.rt.Stop()
	s.timers.Put(t.rt)
}

// isReal reports whether c is clock.Real(), whose timers and deadlines are the runtime's.
// Comparing types, not values, cannot panic on a Clock of an incomparable type.
func isReal(c clock.Clock) bool { return reflect.TypeOf(c) == reflect.TypeOf(clock.Real()) }

// afterFunc calls f on its own goroutine after d on clock c (not the real one), unless
// stop is called first: one goroutine waits on the clock's timer; stop ends it and waits
// for it, so no goroutine outlives the call.
func afterFunc(c clock.Clock, d time.Duration, f func()) (stop func()) {
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
