// Package registry keeps an enforcer's membership in etcd, so that every enforcer knows
// N, the number of live enforcers in its region (docs/design.md §6–7: lease batches are
// rate × share / N / 10, and local fallback limits are limit × share × SLACK / N).
//
// Each enforcer writes <Prefix><Region>/<ID> → {"id","region","addr","started"} under an
// etcd lease it keeps alive, lists the keys under <Prefix><Region>/ and watches them.
// A process that dies stops renewing its lease and disappears after the TTL; one that
// shuts down revokes its lease and disappears at once.
//
// Which way N errs. A larger N gives smaller lease batches (more Redis calls, never more
// admitted) and smaller local fallback limits: it errs under. A smaller N errs over for
// fallback limits. The registry leans toward larger N wherever it must guess:
//   - A dead peer is counted until its lease expires (up to TTL): N too large, under.
//   - While etcd is unreachable Peers keeps the last known count, and always counts this
//     enforcer. Peers that die meanwhile stay counted (under); peers that start
//     meanwhile are unseen (N too small, over, by at most the enforcers started during
//     the outage) until the watch resumes.
//   - A duplicate ID or this enforcer's previous run still holding its key: this
//     enforcer counts itself on top of the holder (under). The holder itself, if alive,
//     sees one too few (over) — which is why duplicates are reported loudly.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/pkg/routine"
)

// Registry is one enforcer's registration in etcd and its view of the region's peers.
//
// Guarantees: Peers is always >= 1 and counts this enforcer exactly once; it is a single
// atomic load, safe to call on the hot path. After Start returns nil the enforcer is
// registered; if etcd is lost the registry keeps trying to re-register (with a new lease
// once the old one has expired) until Close. Close revokes the lease, stops the
// registry's goroutines (its loop and the peer watch the loop runs) and waits for them.
//
// Create with New; the zero value is not usable. All methods are safe for concurrent use.
type Registry struct {
	mu       sync.Mutex // mu guards members, health, onChange and closeErr
	members  []Member
	health   health
	onChange func(n int)
	closeErr error

	peers atomic.Int64 // N, published by the loop

	cfg     Config
	cli     *clientv3.Client
	lessor  clientv3.Lease   // the registry's own lessor: Close stops its goroutines
	watcher clientv3.Watcher // likewise
	key     string           // <Prefix><Region>/<ID>
	prefix  string           // <Prefix><Region>/

	loop      routine.Routine // the loop (loop.go); its context ends at Close
	ready     chan struct{}   // closed by the loop once registered and peers listed
	dupc      chan struct{}   // closed by the loop when a duplicate ID is confirmed
	closeOnce sync.Once       // closes lessor and watcher
}

// New returns a Registry for cfg (zero optional fields take their defaults; see Config)
// using cli, which the caller owns and closes after Close. It does no I/O.
func New(cli *clientv3.Client, cfg Config) (*Registry, error) {
	if cli == nil {
		return nil, fmt.Errorf("registry: etcd client must not be nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Registry{
		cfg:     cfg,
		cli:     cli,
		lessor:  clientv3.NewLease(cli),
		watcher: clientv3.NewWatcher(cli),
		prefix:  cfg.Prefix + cfg.Region + "/",
		ready:   make(chan struct{}),
		dupc:    make(chan struct{}),
	}
	r.key = r.prefix + cfg.ID
	r.peers.Store(1)
	return r, nil
}

// OnChange sets a function called with N each time it changes, from the registry's
// goroutine (it must not block or call back into the Registry's Close). Set it before
// Start; later calls replace it.
func (r *Registry) OnChange(f func(n int)) {
	r.mu.Lock()
	r.onChange = f
	r.mu.Unlock()
}

// Start registers this enforcer and begins watching its region's peers. It returns nil
// once registered and the peers are listed; the error wrapping ErrDuplicateID if another
// live enforcer holds this region and ID; ErrClosed after Close; or ctx.Err() if ctx ends
// first. In every case but ErrClosed the registry keeps trying in the background until
// Close (so an enforcer started while etcd is down registers when etcd returns), and
// Peers counts this enforcer meanwhile. Start may be called once.
func (r *Registry) Start(ctx context.Context) error {
	rec, err := json.Marshal(record{ID: r.cfg.ID, Region: r.cfg.Region, Addr: r.cfg.Addr, HTTPAddr: r.cfg.HTTPAddr, Started: r.cfg.Clock.Now().UTC()})
	if err != nil { // cannot happen: plain strings and a time
		return fmt.Errorf("registry: while encoding the registration: %w", err)
	}
	l, err := newLoop(r, string(rec))
	if err != nil {
		return err
	}
	switch err := r.loop.Start(l.run); {
	case errors.Is(err, routine.ErrClosed):
		return ErrClosed
	case err != nil:
		return fmt.Errorf("registry: Start called twice: %w", err)
	}

	select {
	case <-r.ready:
		return nil
	case <-r.dupc:
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.health.dup
	case <-r.loop.Done():
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Peers returns N, the live enforcers in this region including this one, >= 1. While
// etcd is unreachable it is the last known count (see the package doc for which way
// that errs). One atomic load; no allocation.
func (r *Registry) Peers() int { return int(r.peers.Load()) }

// Members returns the region's registrations as last seen in etcd, sorted by ID (while
// etcd is unreachable, the last view). It is a copy the caller may keep. Unlike Peers it
// does not add this enforcer when its own key is missing or held by another lease.
func (r *Registry) Members() []Member {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Member(nil), r.members...)
}

// Healthy returns nil while this enforcer is registered, its lease is being renewed and
// its peer watch is up; otherwise an error wrapping ErrNotStarted, ErrClosed,
// ErrDuplicateID, ErrNotRegistered, ErrLeaseStale or ErrPeersStale, with details.
func (r *Registry) Healthy() error {
	now := r.cfg.Clock.Now()
	switch {
	case r.loop.Closed():
		return ErrClosed
	case !r.loop.Started():
		return ErrNotStarted
	}
	r.mu.Lock()
	h := r.health
	r.mu.Unlock()
	return h.check(now)
}

// Close revokes the lease (so peers stop counting this enforcer at once; bounded by
// RevokeTimeout, after which the registration expires on its own within TTL), stops the
// registry's goroutine and waits for it. It returns the revoke error, if any, and is
// idempotent: later calls return the same result.
func (r *Registry) Close() error {
	r.loop.Close() // the loop revokes as it exits
	r.closeOnce.Do(func() {
		// Now stop the client-side goroutines the loop used.
		r.lessor.Close()
		r.watcher.Close()
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closeErr
}

// publish makes the loop's view visible to Peers, Members and Healthy, and calls the
// OnChange hook if N changed.
func (r *Registry) publish(n int, members []Member, h health, membersChanged bool) {
	r.mu.Lock()
	if membersChanged {
		r.members = members
	}
	r.health = h
	f := r.onChange
	r.mu.Unlock()
	if old := r.peers.Swap(int64(n)); old != int64(n) && f != nil {
		f(n)
	}
}
