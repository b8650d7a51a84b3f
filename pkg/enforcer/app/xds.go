package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/pkg/envoyrl"
	"github.com/allot-dev/allot/pkg/envoyrl/xds"
	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/rules"
)

// xdsRules keeps the rules holder in step with envoyproxy/ratelimit's configuration
// pushed over xDS (rules.format envoy-ratelimit with rules.xds.server): every set the
// xds.Source accepts becomes rules (rules.FromEnvoy), is compiled for this region and
// swapped in. The guarantees are those of the other rules sources: the Source already
// keeps each broken resource at its last good version and NACKs it; a set that still
// fails to compile is refused whole — the snapshot in force stays — logged and counted
// (allot_rules_failures_total, Status). It is a polledRules: Run waits for the context,
// Reload has nothing to re-read (the server pushes), Close stops the subscription and
// waits for its goroutine.
type xdsRules struct {
	src *xds.Source
	h   *rules.Holder
	opt func() rules.CompileOptions // the compile options, Now included, at each update
	a   *App

	first chan struct{} // closed at the first snapshot stored
	once  sync.Once

	mu sync.Mutex // mu guards st
	st rules.Status
}

// newXDSRules builds the subscription (not started) for a's configuration.
func newXDSRules(a *App) (*xdsRules, error) {
	x := a.cfg.Rules.XDS
	r := &xdsRules{h: a.holder, a: a, first: make(chan struct{})}
	r.opt = func() rules.CompileOptions {
		o := a.compileOptions()
		o.Now = a.clock.Now()
		return o
	}
	var creds credentials.TransportCredentials
	if x.TLS.Enabled {
		tc, err := x.TLS.Build()
		if err != nil {
			return nil, fmt.Errorf("app: rules.xds.tls: %w", err)
		}
		creds = credentials.NewTLS(tc)
	}
	bo := etcdwatch.Backoff{Min: x.BackoffMin, Max: x.BackoffMax, Jitter: !x.NoJitter}
	if bo.Min > 0 && bo.Max == 0 {
		bo.Max = max(bo.Min, 30*time.Second)
	}
	if bo.Min == 0 && bo.Max > 0 {
		bo.Min = min(time.Second, bo.Max)
	}
	src, err := xds.New(xds.Config{
		Server: x.Server, NodeID: x.NodeID, NodeMetadata: x.NodeMetadata, Headers: x.Headers, Creds: creds,
		Merge: a.cfg.Rules.MergeDomains, Backoff: bo, MaxMsgBytes: x.MaxMsgBytes,
		Update: r.update, Clock: a.clock, Log: a.log.Named("xds"),
	})
	if err != nil {
		return nil, fmt.Errorf("app: rules.xds: %w", err)
	}
	r.src = src
	return r, nil
}

// update is the Source's Update: the accepted set, compiled and stored, or refused.
func (r *xdsRules) update(set []*envoyrl.Config) {
	snap, err := rules.Compile(rules.FromEnvoy(set), r.opt())
	now := r.a.clock.Now()
	r.mu.Lock()
	if err != nil {
		r.st.LastError, r.st.ErrorAt = err, now
		r.st.Failures++
		r.mu.Unlock()
		r.a.onRulesError(fmt.Errorf("rules: xDS configuration refused, the rules in force stay: %w", err))
		return
	}
	r.h.Store(snap)
	r.st.Version, r.st.LoadedAt, r.st.LastError = snap.Version(), now, nil
	r.st.Loads++
	r.mu.Unlock()
	r.a.onRulesLoad(snap)
	r.once.Do(func() { close(r.first) })
}

// start subscribes and waits up to d for the first configuration; past it the enforcer
// starts anyway, not ready (Ready) until one arrives.
func (r *xdsRules) start(ctx context.Context, d time.Duration) error {
	if err := r.src.Start(); err != nil {
		return err
	}
	t := r.a.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.first:
	case <-t.C():
		r.a.log.Warn("no rate limit configuration from the xDS server yet; starting, not ready until one arrives",
			"server", r.a.cfg.Rules.XDS.Server, "waited", d, "xds", fmt.Sprint(r.src.Status().Err))
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// loaded says whether a configuration has been stored.
func (r *xdsRules) loaded() bool {
	select {
	case <-r.first:
		return true
	default:
		return false
	}
}

// Run waits for ctx: the subscription runs in the Source's own goroutine.
func (r *xdsRules) Run(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// Reload has nothing to read: the server pushes every change.
func (r *xdsRules) Reload() error { return nil }

// Status is the rules' side, with the Source's refusals: Failures counts the sets that
// did not compile and the responses NACKed in whole or part; LastError is the latest
// of either.
func (r *xdsRules) Status() rules.Status {
	xs := r.src.Status()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.st
	st.Failures += uint64(xs.Rejected)
	if xs.Err != nil && st.LastError == nil {
		st.LastError = xs.Err
	}
	return st
}

// Close ends the subscription and waits for its goroutine.
func (r *xdsRules) Close() error { return r.src.Close() }

// errNoXDSRules is Ready's answer before the first configuration.
var errNoXDSRules = errors.New("rules: none received from the xDS server yet")
