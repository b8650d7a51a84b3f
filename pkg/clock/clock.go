// Package clock is the one small time source allot injects wherever time is kept.
//
// Real wraps time.Now; Fake is advanced by hand so tests never sleep. Both are safe for
// concurrent use. The zero value of neither is meant to be used: call Real() or NewFake.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and makes timers. Implementations are safe for concurrent use.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that allot uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real returns the wall clock.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a Clock that moves only when Advance or Set is called. Timers fire, in deadline
// order, when the fake time reaches them. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex // mu guards now and timers
	now    time.Time
	timers []*fakeTimer
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock forward by d and fires every timer whose deadline has passed.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the clock to t (never backwards) and fires due timers.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.now = t
	}
	now := f.now
	var due []*fakeTimer
	keep := f.timers[:0]
	for _, tm := range f.timers {
		if !tm.at.After(now) {
			due = append(due, tm)
		} else {
			keep = append(keep, tm)
		}
	}
	f.timers = keep
	f.mu.Unlock()
	for _, tm := range due {
		select {
		case tm.c <- now:
		default:
		}
	}
}

// Timers reports how many timers are waiting; tests use it to know a goroutine has parked.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Waiting reports whether a timer is waiting to fire at exactly at: a test that knows
// where a goroutine will park (a deadline it computed) waits for that timer, not merely
// for some timer, before it advances the clock.
func (f *Fake) Waiting(at time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, tm := range f.timers {
		if tm.at.Equal(at) {
			return true
		}
	}
	return false
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	tm := &fakeTimer{f: f, at: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		tm.c <- f.now
	} else {
		f.timers = append(f.timers, tm)
	}
	f.mu.Unlock()
	return tm
}

type fakeTimer struct {
	f  *Fake
	at time.Time
	c  chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	for i, tm := range t.f.timers {
		if tm == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			return true
		}
	}
	return false
}
