package sim

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

// Epoch is the virtual time a run starts at. Fixed, so a seed gives the same bytes.
var Epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// scheduler is the virtual clock and its discrete-event queue. The simulator's one
// goroutine pops events in (time, order scheduled) order and sets the clock to each before
// running it; nothing else moves the clock. It implements clock.Clock for the layers under
// test (Now is one atomic load; NewTimer's timers fire as events), so they all read the
// same virtual time.
//
// Safe for concurrent use (the layers may read the clock from anywhere), but only the run
// loop advances it.
type scheduler struct {
	mu    sync.Mutex // mu guards events, seq and round
	now   atomic.Int64
	seq   uint64
	round uint64 // see setRound
	queue eventHeap
}

type event struct {
	at    int64 // ns since Epoch
	round uint64
	seq   uint64
	fn    func()
	tm    *vtimer // a timer to fire instead of fn (no closure per timer)
}

var _ clock.Clock = (*scheduler)(nil)

// Now implements clock.Clock.
func (s *scheduler) Now() time.Time { return Epoch.Add(time.Duration(s.now.Load())) }

// elapsed is the virtual time since Epoch.
func (s *scheduler) elapsed() time.Duration { return time.Duration(s.now.Load()) }

// at schedules fn at virtual time t (since Epoch); a time in the past runs next.
func (s *scheduler) at(t time.Duration, fn func()) {
	s.mu.Lock()
	s.seq++
	s.queue.push(event{at: max(int64(t), s.now.Load()), round: s.round, seq: s.seq, fn: fn})
	s.mu.Unlock()
}

// setRound makes the events scheduled from now on run after those of an earlier round
// that fall at the same instant, whenever they were scheduled. The coordinator's clock
// numbers its rounds so that its events keep the order the sequential run gave them
// (see world.run); a region's clock stays in round 0, ordered as scheduled.
func (s *scheduler) setRound(r uint64) {
	s.mu.Lock()
	s.round = r
	s.mu.Unlock()
}

// after schedules fn d from now.
func (s *scheduler) after(d time.Duration, fn func()) { s.at(s.elapsed()+d, fn) }

// peek returns the time of the next event, or false if none.
func (s *scheduler) peek() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return 0, false
	}
	return s.queue[0].at, true
}

// runNext sets the clock to the next event's time and runs it.
func (s *scheduler) runNext() {
	s.mu.Lock()
	ev := s.queue.pop()
	s.mu.Unlock()
	s.set(ev.at)
	if ev.tm != nil {
		ev.tm.fire(s.Now())
		return
	}
	ev.fn()
}

// set moves the clock to t (ns since Epoch), never back.
func (s *scheduler) set(t int64) {
	if t > s.now.Load() {
		s.now.Store(t)
	}
}

// NewTimer implements clock.Clock: the timer fires (a non-blocking send) as an event.
func (s *scheduler) NewTimer(d time.Duration) clock.Timer {
	t := &vtimer{c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- s.Now()
		return t
	}
	s.mu.Lock()
	s.seq++
	s.queue.push(event{at: s.now.Load() + int64(d), round: s.round, seq: s.seq, tm: t})
	s.mu.Unlock()
	return t
}

// fire delivers the timer's tick unless it was stopped (a stopped timer's event is left
// in the queue and fires as nothing).
func (t *vtimer) fire(now time.Time) {
	if t.stopped.CompareAndSwap(false, true) {
		select {
		case t.c <- now:
		default:
		}
	}
}

type vtimer struct {
	c       chan time.Time
	stopped atomic.Bool // fired or stopped
}

func (t *vtimer) C() <-chan time.Time { return t.c }
func (t *vtimer) Stop() bool          { return t.stopped.CompareAndSwap(false, true) }

// eventHeap is a binary min-heap on (at, round, seq).
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	a, b := &h[i], &h[j]
	return a.at < b.at || a.at == b.at && (a.round < b.round || a.round == b.round && a.seq < b.seq)
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = event{}
	q = q[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && q.less(l, m) {
			m = l
		}
		if r < n && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}
