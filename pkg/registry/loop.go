package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/routine"
)

// loop is the state of the registry's goroutine. Only run and the methods below touch
// it; what others may read is copied out through Registry.publish. The peer view is kept
// by an etcdwatch.Loop in a goroutine of the loop's own (peerWatch), whose calls are handed
// to the loop's goroutine (calls) and run there, in order, with the registration state
// they touch.
type loop struct {
	r     *Registry
	ctx   context.Context // ended by Registry.Close; parent of every etcd call the loop makes
	value string          // the JSON record to register

	// The registration.
	lease     clientv3.LeaseID // current lease; 0 while not registered
	prevLease clientv3.LeaseID // the lease that last held our key, after it was lost
	regRev    int64            // revision of our last successful claim
	kaCh      <-chan *clientv3.LeaseKeepAliveResponse
	kaCancel  context.CancelFunc
	needReg   bool
	regTimer  clock.Timer
	regBack   *etcdwatch.Backoff
	conflict  *conflict

	// The peer view.
	peers     *peerSet
	peerWatch routine.Routine // runs lw
	lw        *etcdwatch.Loop
	calls     chan func() // lw's handler calls, to run on the loop's goroutine
	needList  bool        // not listed yet, or the watch ended and a new list is due

	h         health
	dirty     bool // peers changed since the last publish
	readySent bool
	dupSent   bool
}

func newLoop(r *Registry, value string) (*loop, error) {
	l := &loop{
		r:        r,
		value:    value,
		needReg:  true,
		needList: true,
		regBack:  &etcdwatch.Backoff{Min: r.cfg.BackoffMin, Max: r.cfg.BackoffMax, Jitter: true},
		peers:    newPeerSet(r.prefix, r.cfg.Region),
		calls:    make(chan func()),
	}
	lw, err := etcdwatch.New(etcdClient{r.cli, r.watcher}, etcdwatch.Config{
		Prefix: r.prefix, Timeout: r.cfg.RequestTimeout, Clock: r.cfg.Clock,
		Backoff: etcdwatch.Backoff{Min: r.cfg.BackoffMin, Max: r.cfg.BackoffMax, Jitter: true},
	}, etcdwatch.Handler{
		OnList: func(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) {
			l.onLoop(ctx, func() { l.listed(kvs, rev) })
		},
		OnEvents: func(ctx context.Context, evs []*clientv3.Event, _ int64) {
			l.onLoop(ctx, func() { l.watched(evs) })
		},
		OnError: func(ctx context.Context, f etcdwatch.Failure) {
			l.onLoop(ctx, func() { l.peersFailed(f) })
		},
	})
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	l.lw = lw
	return l, nil
}

// etcdClient is the registry's client for its peer watch: reads through the caller's
// client, the watch through the registry's own watcher (closed by Registry.Close).
type etcdClient struct {
	clientv3.KV
	clientv3.Watcher
}

// onLoop hands f to the loop's goroutine, which runs it; it gives up when ctx ends.
func (l *loop) onLoop(ctx context.Context, f func()) {
	select {
	case l.calls <- f:
	case <-ctx.Done():
	}
}

func timerC(t clock.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C()
}

// run is the registry's goroutine: it registers, starts the peer watch, and reacts to
// lease loss and to what the peer watch reports, until ctx ends (Registry.Close); then it
// releases the registration.
func (l *loop) run(ctx context.Context) {
	r := l.r
	l.ctx = ctx
	_ = l.peerWatch.Start(l.lw.Run) // cannot fail: the first Start of a new Routine
	for {
		l.publish() // before the attempt below, which may block up to RequestTimeout
		if l.needReg && l.regTimer == nil && l.ctx.Err() == nil {
			l.register()
		}
		l.publish()
		select {
		case <-l.ctx.Done():
			l.shutdown()
			return
		case resp, ok := <-l.kaCh:
			if !ok {
				l.lost("keep-alive ended: lease expired or etcd unreachable for longer than its TTL")
				continue
			}
			l.h.lastRenew = r.cfg.Clock.Now()
			l.h.ttl = time.Duration(resp.TTL) * time.Second
		case f := <-l.calls:
			f()
		case <-timerC(l.regTimer):
			l.regTimer = nil
		}
	}
}

// publish copies the loop's view out to the Registry and signals Start.
func (l *loop) publish() {
	r := l.r
	n := l.peers.count(r.key, l.ours)
	var members []Member
	if l.dirty {
		members = l.peers.members()
	}
	r.publish(n, members, l.h, l.dirty)
	l.dirty = false
	if !l.readySent && l.h.registered && !l.needList {
		l.readySent = true
		close(r.ready)
	}
	if !l.dupSent && !l.readySent && l.h.dup != nil {
		l.dupSent = true
		close(r.dupc)
	}
}

// ours reports whether lease is, or last was, this enforcer's registration.
func (l *loop) ours(lease int64) bool {
	return lease != 0 && (lease == int64(l.lease) || lease == int64(l.prevLease))
}

// register grants a lease, claims our key with it and starts the keep-alive. The claim
// succeeds only if the key is free or held by our own previous lease; otherwise some
// other lease holds it and we wait for it to expire, or report a duplicate.
func (l *loop) register() {
	r := l.r
	ctx, cancel := context.WithTimeout(l.ctx, r.cfg.RequestTimeout)
	defer cancel()
	if err := l.claim(ctx); err != nil {
		if l.ctx.Err() != nil {
			return
		}
		l.h.regErr = err
		d := l.regBack.Next()
		var ce *conflictErr
		if errors.As(err, &ce) && !ce.c.expiresBy.IsZero() {
			// Retry soon after the holder should have expired, not later.
			if left := ce.c.expiresBy.Sub(r.cfg.Clock.Now()); left > 0 && left < d {
				d = left + r.cfg.BackoffMin
			}
		}
		r.cfg.Logger.Warn("registration failed; will retry", "key", r.key, "retry-in", d, "error", err)
		l.regTimer = r.cfg.Clock.NewTimer(d)
	}
}

// claim is one registration attempt. When another lease holds our key it returns a
// *conflictErr.
func (l *loop) claim(ctx context.Context) error {
	r := l.r
	g, err := r.lessor.Grant(ctx, int64(r.cfg.TTL/time.Second))
	if err != nil {
		return fmt.Errorf("while granting a lease: %w", err)
	}
	lease := g.ID
	ok := false
	defer func() {
		if !ok { // do not leave an unused lease (or a claim it made) to linger for a TTL
			rctx, cancel := context.WithTimeout(context.Background(), r.cfg.RevokeTimeout)
			_, _ = r.lessor.Revoke(rctx, lease)
			cancel()
		}
	}()
	put := clientv3.OpPut(r.key, l.value, clientv3.WithLease(lease))
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
		Then(put).
		Else(clientv3.OpGet(r.key)).
		Commit()
	if err != nil {
		return fmt.Errorf("while claiming %s: %w", r.key, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return fmt.Errorf("while claiming %s: deleted during the claim", r.key)
		}
		holder := clientv3.LeaseID(kvs[0].Lease)
		if holder == 0 || holder != l.prevLease {
			return l.conflicted(ctx, kvs[0])
		}
		// Our own registration from before the lease was lost on our side (etcd was
		// unreachable): take it over, unless it changed hands meanwhile.
		resp, err = r.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.LeaseValue(r.key), "=", holder)).
			Then(put).
			Commit()
		if err != nil {
			return fmt.Errorf("while reclaiming %s from lease %x: %w", r.key, holder, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("while reclaiming %s from lease %x: changed hands", r.key, holder)
		}
	}
	kctx, kcancel := context.WithCancel(l.ctx)
	ch, err := r.lessor.KeepAlive(kctx, lease)
	if err != nil {
		kcancel()
		return fmt.Errorf("while starting the keep-alive of lease %x: %w", lease, err)
	}
	ok = true
	now := r.cfg.Clock.Now()
	if l.prevLease != 0 { // holds nothing now; free it rather than let it expire
		_, _ = r.lessor.Revoke(ctx, l.prevLease)
		l.prevLease = 0
	}
	l.lease, l.kaCh, l.kaCancel = lease, ch, kcancel
	l.regRev = resp.Header.Revision
	l.needReg, l.conflict = false, nil
	l.regBack.Reset()
	l.h = health{registered: true, lease: int64(lease), ttl: time.Duration(g.TTL) * time.Second,
		lastRenew: now, listErr: l.h.listErr}
	_ = l.peers.put(r.key, []byte(l.value), int64(lease), l.regRev)
	l.dirty = true
	r.cfg.Logger.Info("registered", "key", r.key, "lease-id", fmt.Sprintf("%x", int64(lease)),
		"ttl", l.h.ttl)
	return nil
}

// conflicted records that another lease holds our key and returns the error to report.
func (l *loop) conflicted(ctx context.Context, held *mvccpb.KeyValue) error {
	r := l.r
	now := r.cfg.Clock.Now()
	holder := held.Lease
	if l.conflict == nil || l.conflict.holder != holder {
		c := &conflict{holder: holder, firstSeen: now}
		p := newPeerSet(r.prefix, r.cfg.Region)
		_ = p.put(r.key, held.Value, holder, held.ModRevision)
		c.member, _ = p.get(r.key)
		if holder != 0 {
			ttl, err := r.lessor.TimeToLive(ctx, clientv3.LeaseID(holder))
			if err != nil {
				return fmt.Errorf("while asking the TTL of lease %x holding %s: %w", holder, r.key, err)
			}
			left := max(time.Duration(ttl.TTL)*time.Second, 0)
			c.expiresBy = now.Add(left + expiryGrace)
		}
		l.conflict = c
	}
	err := l.conflict.err(r.key, now)
	if l.conflict.confirmed(now) && l.h.dup == nil {
		l.h.dup = err
		r.cfg.Logger.Error("duplicate enforcer id in region", "key", r.key, "error", err)
	}
	return &conflictErr{c: l.conflict, err: err}
}

// expiryGrace is how long past its remaining TTL a dead holder's lease may still hold
// our key: etcd reports the remaining TTL truncated to whole seconds (< 1s), checks for
// expired leases every 500ms and then revokes them through raft.
const expiryGrace = 2 * time.Second

// conflictErr carries the conflict to register's retry timing.
type conflictErr struct {
	c   *conflict
	err error
}

func (e *conflictErr) Error() string { return e.err.Error() }
func (e *conflictErr) Unwrap() error { return e.err }

// lost drops the registration: stop the keep-alive and register again.
func (l *loop) lost(why string) {
	r := l.r
	if l.kaCancel != nil {
		l.kaCancel()
	}
	if l.lease != 0 {
		l.prevLease = l.lease
	}
	r.cfg.Logger.Warn("registration lost; re-registering", "key", r.key,
		"lease-id", fmt.Sprintf("%x", int64(l.lease)), "reason", why)
	l.lease, l.kaCh, l.kaCancel = 0, nil, nil
	l.needReg = true
	l.h.registered = false
	l.h.regErr = errors.New(why)
}

// listed takes a listing of the region's registrations as of rev (the peer watch goes
// on from there).
func (l *loop) listed(kvs []*mvccpb.KeyValue, rev int64) {
	r := l.r
	ps := make([]kv, len(kvs))
	for i, e := range kvs {
		ps[i] = kv{key: string(e.Key), value: e.Value, lease: e.Lease, rev: e.ModRevision}
	}
	for _, err := range l.peers.reset(ps) {
		r.cfg.Logger.Warn("odd registration; counted anyway", "error", err)
	}
	if l.lease != 0 {
		// Keep our own claim if it is newer than this listing.
		if rev < l.regRev {
			_ = l.peers.put(r.key, []byte(l.value), int64(l.lease), l.regRev)
		} else if m, ok := l.peers.get(r.key); !ok || m.Lease != int64(l.lease) {
			l.lost("registration missing from the peer list")
		}
	}
	l.dirty = true
	l.needList = false
	l.h.listErr = nil
}

// peersFailed records that the peer view is stale: a list failed, or the watch ended and
// the peer watch lists again.
func (l *loop) peersFailed(f etcdwatch.Failure) {
	r := l.r
	l.h.listErr = f.Err
	switch {
	case f.Listing:
		r.cfg.Logger.Warn("listing peers failed; will retry", "prefix", r.prefix, "retry-in", f.RetryIn, "error", f.Err)
		return
	case f.Compacted:
		r.cfg.Logger.Info("peer watch compacted; listing again", "prefix", r.prefix)
	default:
		r.cfg.Logger.Warn("peer watch ended; listing again", "prefix", r.prefix, "error", f.Err)
	}
	l.needList = true
}

// watched applies one watch response's events.
func (l *loop) watched(evs []*clientv3.Event) {
	r := l.r
	for _, ev := range evs {
		key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
		own := key == r.key && l.lease != 0 && rev > l.regRev
		switch ev.Type {
		case clientv3.EventTypePut:
			if err := l.peers.put(key, ev.Kv.Value, ev.Kv.Lease, rev); err != nil {
				r.cfg.Logger.Warn("odd registration; counted anyway", "error", err)
			}
			if own && ev.Kv.Lease != int64(l.lease) {
				r.cfg.Logger.Error("registration overwritten by another lease: duplicate id?",
					"key", key, "lease-id", fmt.Sprintf("%x", ev.Kv.Lease))
				l.lost("registration overwritten by another lease")
			}
		case clientv3.EventTypeDelete:
			l.peers.del(key, rev)
			if own {
				l.lost("registration deleted")
			} else if key == r.key && l.needReg && l.regTimer != nil {
				// The lease that held our key is gone: claim it now, not after the backoff.
				l.regTimer.Stop()
				l.regTimer = nil
			}
		}
		l.dirty = true
	}
}

// shutdown releases the registration: revoking the lease deletes our key at once.
func (l *loop) shutdown() {
	r := l.r
	if l.kaCancel != nil {
		l.kaCancel()
	}
	l.peerWatch.Close() // its context ends now; a list or a hand-over under way is abandoned
	if l.regTimer != nil {
		l.regTimer.Stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RevokeTimeout)
	defer cancel()
	var errs []error
	for _, id := range []clientv3.LeaseID{l.lease, l.prevLease} {
		if id == 0 {
			continue
		}
		if _, err := r.lessor.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("registry: while revoking lease %x of %s: %w", int64(id), r.key, err))
		}
	}
	if len(errs) > 0 {
		r.cfg.Logger.Warn("could not release the registration; it expires within TTL", "key", r.key,
			"ttl", r.cfg.TTL, "error", errors.Join(errs...))
	} else if l.lease != 0 {
		r.cfg.Logger.Info("registration released", "key", r.key)
	}
	r.mu.Lock()
	r.closeErr = errors.Join(errs...)
	r.mu.Unlock()
}
