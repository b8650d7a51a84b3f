package lease

import (
	"context"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Background refills. A key whose lease falls to half a batch is queued (at most once: its
// flight marks it) for one of Config.Refillers goroutines, which asks the next store for a
// batch and adds what it gets. A refill's error is told to nobody but the Observer; the
// key backs off for one window, and when its tokens run out the next check calls the next
// store itself and sees the error (so a breaker above this layer sees it too).

// enqueue queues a background refill for e. Called with e's shard lock held; never blocks.
// With Config.SyncRefill it marks the flight and returns true: the caller runs the refill.
func (s *Store) enqueue(e *entry) (runNow bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.shutting {
		return false
	}
	s.bg.Add(1)
	if s.cfg.SyncRefill {
		e.flight = &flight{bg: true}
		return true
	}
	select {
	case s.work <- e:
		e.flight = &flight{bg: true}
	default:
		s.bg.Done()
		s.emit(EventRefillSkipped, 0)
	}
	return false
}

func (s *Store) refiller() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stop:
			return
		case e := <-s.work:
			s.refill(e)
		}
	}
}

// refill makes one background refill call for e, whose flight was set by enqueue.
func (s *Store) refill(e *entry) {
	sh := s.shardOf(e.key)
	sh.mu.Lock()
	f := e.flight
	var req *bucket.Request
	now := s.now()
	peers := s.peersOf(e, now)
	ttl, opening := s.ttl, false
	if !e.gone {
		if b, t, ok, o := s.leaseBatch(e, e.limits, e.lastCost, peers, now); ok {
			ttl, opening = t, o
			e.batch = b
			// Never above 1.5 batches held (but for one check's cost): a refill at half a
			// batch asks a whole one; one that finds more than half (the batch has shrunk
			// since it was queued) asks the rest.
			want := b
			if held := e.held(); 2*held > b {
				want = max(b+b/2-held, e.lastCost)
			}
			req = &bucket.Request{Identity: e.key, Limits: e.limits, Want: want, Min: e.lastCost, Penalty: e.penalty}
			s.sight(e, req, now)
			e.handOver(req)
		}
	}
	if req == nil { // evicted, gone quiet, or no longer worth a lease
		e.contended = false // so the next check calls in the foreground, not for this again
		s.land(e, f)
		sh.mu.Unlock()
		s.landed()
		return
	}
	gen := e.gen
	sh.mu.Unlock()

	s.emit(EventRefill, req.Want)
	start := s.now()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RefillTimeout)
	res, err := s.take(ctx, req) // valid: e.limits came from a validated request, lastCost <= batch <= min burst
	cancel()

	sh.mu.Lock()
	if err == nil && res.Seen > 0 && !e.gone {
		e.seen, e.seenAt = res.Seen, start
	}
	switch {
	case err != nil:
		e.unpaid += req.Refused // not heard: counted at the next call
		e.refillAfter = start + s.window
		s.emit(EventRefillError, 0)
	case gen != e.gen || e.gone:
		if res.Granted > 0 {
			s.emit(EventGranted, res.Granted)
			s.emit(EventLimitsChanged, res.Granted)
		}
	default:
		if res.Penalized && e.held() > 0 {
			s.emit(EventLimitsChanged, e.dropLease())
		}
		e.observe(req, res, start)
		e.setContended(!opening && res.Granted < req.Want, start, req.Limits, req.Want, peers, s.cfg.Window)
		if res.Granted > 0 {
			s.emit(EventGranted, res.Granted)
			e.add(res.Granted, start+ttl)
		}
	}
	s.land(e, f)
	sh.mu.Unlock()
	s.landed()
}

// land ends a background flight f of e. Called with e's shard lock held; the caller
// releases it and then calls landed.
func (s *Store) land(e *entry, f *flight) {
	if e.flight == f {
		e.flight = nil
	}
	f.landed()
}

// landed counts a background refill done, after its shard lock is released.
func (s *Store) landed() {
	s.bg.Done()
	if s.hooks.landed != nil {
		s.hooks.landed()
	}
}

// Close stops the background refills and waits for them: refills in flight are cancelled
// (their tokens, if the next store granted any, are dropped). After Close, Take returns
// ErrClosed. Close is idempotent and safe for concurrent use; it does not close the next
// store.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.shutting = true
		s.closed.Store(true)
		s.mu.Unlock()
		close(s.stop)
		s.cancel()
		s.wg.Wait()
		for { // refills queued but never picked up: end their flights so no waiter hangs
			select {
			case e := <-s.work:
				sh := s.shardOf(e.key)
				sh.mu.Lock()
				s.land(e, e.flight)
				sh.mu.Unlock()
				s.landed()
			default:
				return
			}
		}
	})
	return nil
}
