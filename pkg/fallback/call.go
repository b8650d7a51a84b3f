package fallback

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// A call to the next store runs on its own goroutine, owned by the Store, under its own
// deadline (ReplyTimeout; ProbeTimeout for a probe); the check that made it waits for it
// only Timeout at a time (see ask). The call's outcome goes to its shard's breaker
// (judge, settle) before it goes to the check, so a check answered locally after a failed
// call already sees the breaker it opened.

const (
	waiting   int32 = iota // the check waits for the answer
	served                 // the answer is in; the check owns the call again
	abandoned              // the check left; the call's goroutine returns the call to the pool
)

// call is one call to the next store, pooled. The checking goroutine fills it and starts
// the call; from then on whichever side finishes with it last returns it to the pool: the
// check after reading a served answer, or the call's goroutine when it finds the check gone.
type call struct {
	req    bucket.Request // a copy: the caller may reuse its request once Take returns
	limits [bucket.MaxLimits]bucket.Limit
	b      *breaker
	w      uint64 // the breaker's word when the call was made
	probe  bool
	sent   int64 // Unix µs
	res    bucket.Result
	err    error
	state  atomic.Int32
	done   chan struct{} // cap 1: one send per served answer
}

// ask makes a call for a validated request and waits for its answer: Timeout, and one
// Timeout more each time either the shard answered some call within the last
// ReplyTimeout/2, or was last given work with none in flight that recently (it is alive,
// or has not been silent for long; this process or its queue is slow) or has never answered
// yet (its first calls pay for dialling), or the wait ended a whole Timeout late (this
// process was not running, and the answer may be waiting to be read); at most until the
// call's own deadline. A check that stops waiting is answered
// locally, or gets its context's error if that ended first; the call goes on.
//
// A fail-closed check always waits until the call's deadline (ReplyTimeout): its local
// answer is a refusal, which a slow process must not turn good traffic into.
//
// Which way it errs: on a shard that has just died, checks made within ReplyTimeout/2 of
// its last answer wait until that much time has passed since it (≤ 50 ms by default)
// before they are answered locally, and on a shard dead since start checks wait up to
// ReplyTimeout until its breaker opens: slower, never refused or loosened. Later checks
// wait Timeout, until the breaker opens.
func (s *Store) ask(ctx context.Context, b *breaker, w uint64, req *bucket.Request, probe bool) (bucket.Result, error) {
	if s.cfg.Inline {
		sent := s.clock.Now()
		res, err := s.take(ctx, req)
		s.heard(b, w, probe, res, err, false, sent.UnixMicro(), s.clock.Now())
		return s.answer(b, req, res, err)
	}
	c := s.start(b, w, req, probe)
	if c == nil {
		if s.closed.Load() {
			return bucket.Result{}, ErrClosed
		}
		return s.answerLocally(b, req, s.clock.Now(), LocalBound)
	}
	end := c.sent + s.deadline(probe).Microseconds()
	alive := s.cfg.ReplyTimeout.Microseconds() / 2
	due := c.sent + s.cfg.Timeout.Microseconds()
	for {
		t := s.newTimer(time.Duration(due-s.clock.Now().UnixMicro()) * time.Microsecond)
		select {
		case <-c.done:
			s.stopTimer(t)
			return s.collect(c, req)
		case <-ctx.Done():
			s.stopTimer(t)
			if c.state.CompareAndSwap(waiting, abandoned) {
				return bucket.Result{}, ctx.Err()
			}
			<-c.done
			return s.collect(c, req)
		case <-t.c():
			s.stopTimer(t)
		}
		now := s.clock.Now().UnixMicro()
		late := now-due >= s.cfg.Timeout.Microseconds()
		// The shard's silence runs from its latest reply, or from when it was last given
		// work with none in flight, whichever is later: a shard with little traffic has
		// not been silent since its last reply, it had nothing to answer.
		r := b.replied.Load() // 0: never heard from; its first calls may be dialling
		if r != 0 {
			r = max(r, b.woke.Load())
		}
		// A fail-closed check waits for the reply itself: answering it locally would
		// refuse it, and a slow moment of this process is no reason to refuse good
		// traffic (P2). It is refused on evidence only: an error, a missing reply, an
		// open breaker.
		if (req.FailClosed || r == 0 || now-r <= alive || late) && now < end {
			due = now + s.cfg.Timeout.Microseconds()
			continue
		}
		if c.state.CompareAndSwap(waiting, abandoned) {
			s.logSilence(b, r, now)
			return s.answerLocally(b, req, time.UnixMicro(now), LocalWait)
		}
		<-c.done // answered as the wait ended: use it
		return s.collect(c, req)
	}
}

func (s *Store) deadline(probe bool) time.Duration {
	if probe {
		return s.cfg.ProbeTimeout
	}
	return s.cfg.ReplyTimeout
}

// start starts a call on its own goroutine, or returns nil when the shard already has
// MaxInFlight calls in flight (a probe is never refused) or the Store is closed.
func (s *Store) start(b *breaker, w uint64, req *bucket.Request, probe bool) *call {
	n := b.inFlight.Add(1)
	if n > int32(s.cfg.MaxInFlight) && !probe {
		b.inFlight.Add(-1)
		return nil
	}
	s.mu.RLock()
	if s.closed.Load() {
		s.mu.RUnlock()
		b.inFlight.Add(-1)
		return nil
	}
	s.wg.Add(1)
	s.mu.RUnlock()
	c := s.calls.Get().(*call)
	k := copy(c.limits[:], req.Limits)
	c.req = *req
	c.req.Limits = c.limits[:k]
	c.b, c.w, c.probe = b, w, probe
	c.sent = s.clock.Now().UnixMicro()
	if n == 1 { // the shard had nothing to answer until now: its silence starts here
		raise(&b.woke, c.sent)
	}
	c.state.Store(waiting)
	go s.run(c)
	return c
}

// run makes the call, tells its breaker, and hands the answer to the check (or, if the
// check has left, drops it: tokens it granted were taken and are not spent, which errs
// under).
func (s *Store) run(c *call) {
	defer s.wg.Done()
	d := s.deadline(c.probe)
	ctx, expired, stop := s.callContext(c.sent, d)
	res, err := s.take(ctx, &c.req)
	exp := err != nil && expired()
	stop()
	s.heard(c.b, c.w, c.probe, res, err, exp, c.sent, s.clock.Now())
	c.b.inFlight.Add(-1)
	c.res, c.err = res, err
	if c.state.CompareAndSwap(waiting, served) {
		c.done <- struct{}{}
		return
	}
	s.put(c)
}

// heard tells b's breaker the outcome of a call sent at sent (Unix µs) and answered at
// now; exp says its deadline had passed.
func (s *Store) heard(b *breaker, w uint64, probe bool, res bucket.Result, err error, exp bool, sent int64, now time.Time) {
	o := s.judge(b, res, err, exp, sent, now.UnixMicro(), probe)
	if o == replied {
		raise(&b.replied, now.UnixMicro())
		raise(&s.anyReplied, now.UnixMicro())
		raise(&s.anySent, sent)
	}
	if probe {
		s.settleProbe(b, w, o, err, now)
	} else {
		s.settle(b, w, o, err, now)
	}
}

// raise sets v to t if t is later.
func raise(v *atomic.Int64, t int64) {
	for r := v.Load(); r < t && !v.CompareAndSwap(r, t); r = v.Load() {
	}
}

// collect turns a served call into the check's answer and returns the call to the pool.
// The breaker has already heard the call's outcome.
func (s *Store) collect(c *call, req *bucket.Request) (bucket.Result, error) {
	res, err, b := c.res, c.err, c.b
	s.put(c)
	return s.answer(b, req, res, err)
}

// answer is the check's answer to a call's outcome: the store's, or a local one.
func (s *Store) answer(b *breaker, req *bucket.Request, res bucket.Result, err error) (bucket.Result, error) {
	switch {
	case err == nil:
		s.obs.Decision(b.shard, res.Source, res.Granted > 0)
		return res, nil
	case isInvalid(err):
		return bucket.Result{}, err
	case s.closed.Load():
		return bucket.Result{}, ErrClosed
	}
	return s.answerLocally(b, req, s.clock.Now(), LocalError)
}

func isInvalid(err error) bool { return errors.Is(err, bucket.ErrInvalid) }

func (s *Store) put(c *call) {
	c.req, c.res, c.err, c.b = bucket.Request{}, bucket.Result{}, nil, nil
	clear(c.limits[:])
	s.calls.Put(c)
}
