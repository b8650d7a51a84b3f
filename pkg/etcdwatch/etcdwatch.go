// Package etcdwatch keeps a process in step with the keys under one etcd prefix: it lists
// the prefix, watches it from the list's revision + 1, and when the watch fails lists
// again, waiting between attempts while etcd fails. The rules (pkg/rules), the shares
// watcher (pkg/enforcer/overrides) and the registry's peer view (pkg/registry) run it;
// what each keeps, logs and counts on an error is its own (Handler).
//
// The loop, until its context ends:
//
//	list ──ok──→ OnList → watch from rev+1 ──each response──→ OnEvents
//	  │                         │
//	  │ failed                  ├ compacted: OnError, list again at once
//	  └→ OnError, wait          └ any other end: OnError, wait, list again
//
// Each wait is the next step of a Backoff (Min, doubling up to Max); a list that succeeds
// starts the backoff over. A watch starts at the revision after the list before it (the
// first one, after an owner's own List: see Run), so the list and then the events give
// every change once, in revision order. An owner that also lists on its own while Run runs
// (a Load) can see a change twice: it skips events at or below the revision it holds.
package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrWatchClosed: etcd's client closed the watch channel (its context ended, or the
// client was closed) without an error of its own.
var ErrWatchClosed = errors.New("etcdwatch: watch channel closed")

// Client is the part of an etcd client a Loop uses. *clientv3.Client is one; so is a
// struct of a clientv3.KV and a clientv3.Watcher of its own.
type Client interface {
	Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error)
	Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan
}

// Config configures a Loop. Every field but the probe and ProgressNotify is required.
type Config struct {
	// Prefix is the key prefix listed and watched; not empty (that would be all of etcd).
	Prefix string
	// Timeout bounds one list; > 0.
	Timeout time.Duration
	// Backoff paces the attempts while etcd fails: 0 < Min <= Max. Each Run starts from
	// a copy of it.
	Backoff Backoff
	// Clock times the waits and the probe.
	Clock clock.Clock
	// ProgressNotify asks etcd for progress notifications while nothing changes: OnEvents
	// gets them with no events and the revision etcd has reached.
	ProgressNotify bool
	// ProbeEvery, when > 0, has the loop call Handler.OnProbe every ProbeEvery while a
	// watch is up (a watch can stay quiet through an outage the client is hiding).
	ProbeEvery time.Duration
}

// Handler is what a Loop tells its owner. The calls come from the goroutine running Run,
// one at a time, in the loop's order. A failure is not reported once Run's context has
// ended: that is the owner stopping, not etcd failing.
type Handler struct {
	// OnList gets the whole prefix as of revision rev; the watch then starts at rev+1.
	// It may do I/O with ctx. Required.
	OnList func(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64)
	// OnEvents gets one watch response: its events in revision order and the revision
	// of its header (a progress notification has no events). Required.
	OnEvents func(ctx context.Context, events []*clientv3.Event, rev int64)
	// OnError is told of each failed list or ended watch and what the loop does next.
	// Optional.
	OnError func(ctx context.Context, f Failure)
	// OnProbe: see Config.ProbeEvery. Required when ProbeEvery > 0.
	OnProbe func(ctx context.Context)
}

// Failure is one failed list or ended watch.
type Failure struct {
	// Err says which: "while listing <prefix> in etcd: …" or "while watching <prefix>
	// from revision <n>: …", wrapping etcd's error (or ErrWatchClosed).
	Err error
	// Listing: the list failed. Otherwise the watch ended.
	Listing bool
	// Compacted: the watch's start revision was compacted away; the loop lists again at
	// once (RetryIn is 0).
	Compacted bool
	// RetryIn is how long the loop waits before it lists again.
	RetryIn time.Duration
}

// Loop lists and watches one prefix for its owner. New checks the configuration; the
// zero value is not usable. Its methods are safe for concurrent use, but one Loop is
// meant to be Run by one goroutine at a time.
type Loop struct {
	mu     sync.Mutex // mu guards listed
	listed int64      // the revision of the last List, until a Run starts watching after it

	cli Client
	cfg Config
	h   Handler
}

// New returns a Loop for cfg reading cli and telling h. It does no I/O.
func New(cli Client, cfg Config, h Handler) (*Loop, error) {
	switch {
	case cli == nil:
		return nil, errors.New("etcdwatch: client is nil")
	case cfg.Prefix == "":
		return nil, errors.New("etcdwatch: Prefix is empty (it would watch all of etcd)")
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("etcdwatch: Timeout %v, must be > 0", cfg.Timeout)
	case cfg.Backoff.Min <= 0 || cfg.Backoff.Max < cfg.Backoff.Min:
		return nil, fmt.Errorf("etcdwatch: Backoff %v..%v, want 0 < Min <= Max", cfg.Backoff.Min, cfg.Backoff.Max)
	case cfg.Clock == nil:
		return nil, errors.New("etcdwatch: Clock is nil")
	case cfg.ProbeEvery < 0:
		return nil, fmt.Errorf("etcdwatch: ProbeEvery %v, must be >= 0", cfg.ProbeEvery)
	case h.OnList == nil || h.OnEvents == nil:
		return nil, errors.New("etcdwatch: Handler.OnList and OnEvents are required")
	case cfg.ProbeEvery > 0 && h.OnProbe == nil:
		return nil, errors.New("etcdwatch: ProbeEvery is set but Handler.OnProbe is nil")
	}
	return &Loop{cli: cli, cfg: cfg, h: h}, nil
}

// List reads the whole prefix at one revision, bounded by Timeout. It does not call
// OnList: an owner that lists on its own (a Load at start, with its own deadline) folds
// the result in itself, and a Run started after it watches on from its revision.
func (l *Loop) List(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	kvs, rev, err := l.list(ctx)
	if err == nil {
		l.mu.Lock()
		l.listed = rev
		l.mu.Unlock()
	}
	return kvs, rev, err
}

func (l *Loop) list(ctx context.Context) ([]*mvccpb.KeyValue, int64, error) {
	lctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	resp, err := l.cli.Get(lctx, l.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("while listing %s in etcd: %w", l.cfg.Prefix, err)
	}
	return resp.Kvs, resp.Header.Revision, nil
}

// Run lists and watches until ctx ends (see the package doc). After a List by the owner
// (a Load at start) the first watch starts after the revision List returned, without
// listing again.
func (l *Loop) Run(ctx context.Context) {
	l.mu.Lock()
	rev := l.listed
	l.listed = 0
	l.mu.Unlock()
	b := l.cfg.Backoff
	b.Reset()
	for ctx.Err() == nil {
		if rev <= 0 {
			kvs, r, err := l.list(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				d := b.Next()
				l.failed(ctx, Failure{Err: err, Listing: true, RetryIn: d})
				if !l.sleep(ctx, d) {
					return
				}
				continue
			}
			b.Reset()
			rev = r
			l.h.OnList(ctx, kvs, rev)
		}
		err := l.watch(ctx, rev+1)
		rev = 0 // list again before watching again
		if ctx.Err() != nil {
			return
		}
		f := Failure{Err: err, Compacted: errors.Is(err, rpctypes.ErrCompacted)}
		if !f.Compacted {
			f.RetryIn = b.Next()
		}
		l.failed(ctx, f)
		if f.RetryIn > 0 && !l.sleep(ctx, f.RetryIn) {
			return
		}
	}
}

func (l *Loop) failed(ctx context.Context, f Failure) {
	if l.h.OnError != nil {
		l.h.OnError(ctx, f)
	}
}

// watch follows the prefix from revision from until the watch ends or ctx does.
func (l *Loop) watch(ctx context.Context, from int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(from)}
	if l.cfg.ProgressNotify {
		opts = append(opts, clientv3.WithProgressNotify())
	}
	wch := l.cli.Watch(wctx, l.cfg.Prefix, opts...)
	var probe clock.Timer
	if l.cfg.ProbeEvery > 0 {
		probe = l.cfg.Clock.NewTimer(l.cfg.ProbeEvery)
		defer func() { probe.Stop() }()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timerC(probe):
			l.h.OnProbe(ctx)
			probe = l.cfg.Clock.NewTimer(l.cfg.ProbeEvery)
		case wr, ok := <-wch:
			if !ok {
				return fmt.Errorf("while watching %s from revision %d: %w", l.cfg.Prefix, from, ErrWatchClosed)
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("while watching %s from revision %d: %w", l.cfg.Prefix, from, err)
			}
			l.h.OnEvents(ctx, wr.Events, wr.Header.GetRevision())
		}
	}
}

// sleep waits d on the loop's clock; false if ctx ended first.
func (l *Loop) sleep(ctx context.Context, d time.Duration) bool {
	t := l.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

func timerC(t clock.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C()
}

// Backoff is the wait between attempts while etcd fails: Min, doubling on each Next up to
// Max. With Jitter each wait is drawn uniformly from [d/2, d] instead, so that processes
// that lost etcd together do not all return at once. Reset starts from Min again. The
// zero value waits 0; a Backoff is not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	Jitter   bool

	base time.Duration       // the next wait before jitter; < Min means Min
	rnd  func(n int64) int64 // uniform in [0, n); rand.Int64N unless a test sets it
}

// Next returns the wait before the next attempt and doubles the one after it.
func (b *Backoff) Next() time.Duration {
	if b.base < b.Min {
		b.base = b.Min
	}
	d := b.base
	if b.base < b.Max {
		b.base = min(2*b.base, b.Max)
	}
	if !b.Jitter || d <= 0 {
		return d
	}
	rnd := b.rnd
	if rnd == nil {
		rnd = rand.Int64N
	}
	half := d / 2
	return half + time.Duration(rnd(int64(d-half)+1))
}

// Reset starts the next failure from Min again.
func (b *Backoff) Reset() { b.base = 0 }
