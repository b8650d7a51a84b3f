package lease

import (
	"context"

	"github.com/allot-dev/allot/pkg/bucket"
)

// The foreground call: a check that memory does not answer claims its key's one call
// (begin), sized by leaseBatch (batch.go), makes it with the shard lock released and keeps
// what the check does not spend (call). Background refills: refill.go.

// callFor is a foreground call begun for a key: its flight, the request it sends, and
// what it was sized under.
type callFor struct {
	f       *flight // f.req is the request it sends
	gen     uint32
	peers   int
	ttl     int64 // how long what it is granted may be spent
	lease   bool
	opening bool  // the lease is a key's opening lot (leaseBatch)
	why     Event // why the check waits on it (entry.callReason)
}

// begin claims the one foreground call for e's key. Called with sh's lock held, sh being
// e's shard. If the key is busy the call asks for a batch, else it passes the check
// through as it is.
func (s *Store) begin(sh *shard, e *entry, req *bucket.Request, now int64) callFor {
	f := sh.spare
	if f != nil {
		sh.spare = nil
		*f = flight{req: *req}
	} else {
		f = &flight{req: *req}
	}
	c := callFor{f: f, gen: e.gen, peers: s.peersOf(e, now)}
	s.sight(e, &c.f.req, now)
	e.handOver(&c.f.req)
	e.flight = c.f
	batch, ttl, lease, opening := s.leaseBatch(e, req.Limits, req.Want, c.peers, now)
	c.ttl, c.opening, c.why = ttl, opening, e.callReason(lease)
	e.lapsed = false
	if lease {
		e.batch = batch
		c.f.req.Want, c.f.req.Min = batch, req.MinGrant()
	}
	c.lease = lease
	return c
}

// call makes the foreground call c for e's key (begun under the shard lock, which the
// caller has released) and keeps what the check does not spend.
func (s *Store) call(ctx context.Context, sh *shard, e *entry, req *bucket.Request, c callFor, start int64) (bucket.Result, error) {
	s.emit(EventCall, c.f.req.Want)
	s.emit(c.why, 0)
	res, err := s.take(ctx, &c.f.req)

	sh.mu.Lock()
	defer sh.mu.Unlock()
	f := c.f
	defer func() {
		f.landed()
		// No check waits on f (none asked: wait sets done, under this lock, while f is the
		// entry's flight, which it no longer is) and the next store answered, so it holds
		// no pointer to f.req: the shard's next call may reuse it.
		if err == nil && f.done == nil {
			sh.spare = f
		}
	}()
	if e.flight == f {
		e.flight = nil
	}
	if err != nil {
		f.err, f.shared = err, ctx.Err() == nil
		e.unpaid += c.f.req.Refused // not heard: counted at the next call
		s.emit(EventCallError, 0)
		return bucket.Result{}, err
	}
	current := c.gen == e.gen && !e.gone
	if res.Seen > 0 && !e.gone {
		e.seen, e.seenAt = res.Seen, start
	}
	if current {
		if res.Penalized && e.held() > 0 {
			s.emit(EventLimitsChanged, e.dropLease())
		}
		e.observe(&c.f.req, res, start)
		if c.lease {
			e.setContended(!c.opening && res.Granted < c.f.req.Want, start, c.f.req.Limits, c.f.req.Want, c.peers, s.cfg.Window)
		}
	}
	if !c.lease || res.Granted == 0 {
		return res, nil
	}
	s.emit(EventGranted, res.Granted)
	if !current {
		// The limits changed (or the key was evicted) while we were asking: the check may
		// use what it was granted, the rest was taken under other limits and is dropped.
		g := min(res.Granted, req.Want)
		if d := res.Granted - g; d > 0 {
			s.emit(EventLimitsChanged, d)
		}
		res.Granted = g
		return res, nil
	}
	e.add(res.Granted, start+c.ttl)
	g := min(e.held(), req.Want)
	e.spend(g)
	e.lastCost = req.MinGrant()
	res.Granted = g
	res.Remaining += e.held()
	return res, nil
}
