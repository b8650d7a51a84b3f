// Package node composes one enforcer node: the store stack (fallback → lease → a bucket
// store), the share table the balancer's shares are enforced through
// (pkg/enforcer/overrides), the usage table and its reports (pkg/enforcer/report) and the
// check core over them (pkg/enforcer). The enforcer binary (pkg/enforcer/app), regionsim
// (pkg/sim) and, through the app, the in-process deployment (pkg/inprocess) all build
// their enforcers with Build, as etcd's binary, tests and embedders all start a server
// with embed.StartEtcd: regionsim judges the wiring the binary runs, not a copy of it.
//
// What differs between them is a dependency (Deps): the clock, the bucket store (Redis, or
// a memory store), the rules holder and whatever feeds it (a file, etcd, a scenario), the
// metrics, and the transport of the usage reports (gRPC to the balancer's leader, or
// regionsim's delivery on its virtual clock). Everything else is a setting (Config): the
// same Config gives the same node wherever it is built, and Node.Config says what it was.
//
// # The wiring
//
//	checks ─▶ enforcer.Enforcer ─▶ fallback ─▶ lease ─▶ Deps.Store      (Config.Layers)
//	             │      │
//	             │      └─ Shares: overrides.Holder          (Config.Balanced)
//	             └─ Usage: report.Table ─▶ Deps.Transport      (Config.Reports)
//	                          │                 │
//	                          │                 ├─ Shares: Holder.Applied (the version acknowledged)
//	                          │                 ├─ SharesChanged: Holder.Changed (acknowledge early)
//	                          │                 └─ Accepted: Holder.Heard (stale when reports go unheard)
//	                          └─ RegionalRate: global rate × Holder.Share
//
// The share table is always built (a node without the balancer's shares answers the
// default split from it); the check core enforces through it only with Balanced.
package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// ErrConfig is wrapped by every error Config.Validate and Build return for a bad setting
// or a missing dependency.
var ErrConfig = errors.New("node: invalid config")

// Config is everything about a node that is a setting. Start from DefaultConfig. Each
// layer's settings are that layer's own Config; their dependency fields (clocks, hooks,
// loggers, observers) are Build's to set from Deps and are ignored here.
type Config struct {
	// Region is the node's region: the share of each identity it enforces and the region
	// its reports name. Required.
	Region string
	// ID names this enforcer within its region in its usage reports. Required with Reports.
	ID string

	// Check is the check core's settings. Build sets its Region and dependencies (Rules,
	// Store, Clock, Logger, Registerer, Usage, Shares, Peek, Tracer).
	Check enforcer.Config

	// Layers puts fallback → lease over Deps.Store, which then stands for Redis (a Redis
	// store; regionsim's memory store standing for a region's cluster). False: Deps.Store
	// answers every check alone (an exact memory store of this process only).
	Layers bool
	// Lease is the lease layer's settings (Build sets Clock, Peers, Observer and
	// SyncRefill). NoLease leaves the layer out: every check goes through fallback to the
	// store.
	Lease   lease.Config
	NoLease bool
	// Fallback is the fallback layer's settings (Build sets Clock, Peers, Shard, Logger,
	// Observer and Inline).
	Fallback fallback.Config
	// Quota is the calendar quota table's settings (Build sets Clock, Logger, Registerer); used when
	// Deps.Quotas is set.
	Quota quota.Config

	// Balanced: the balancer's shares are read (Deps' caller feeds the share table: an
	// etcd watcher, regionsim's virtual etcd) and enforced. The table then waits for its
	// first set (min(default, Shares.Floor) until it has read one) and exports its
	// metrics. False: every identity enforces its rule's default split.
	Balanced bool
	// Shares is the share table's settings: Stale and Floor. Build sets Region,
	// WaitForSet (Balanced), Reports (Balanced and Reports: a set also goes stale when the
	// balancer has not accepted a report for Stale), Clock, Logger and Registerer.
	Shares overrides.Config

	// Reports: usage reports to the balancer. A usage table observes every enforcing take
	// and Deps.Transport sends it on report.Schedule.
	Reports bool
	// Usage is the usage table's settings. Build sets RegionalRate (the rule's first
	// global rate × this node's share) and holds EarlyGap to at most Interval (a short
	// interval needs no longer gap).
	Usage report.Config
	// AckGap is the least time between reports that acknowledging a new share set brings
	// forward (report.ReporterConfig.AckGap). Must be > 0 with Reports.
	AckGap time.Duration
}

// DefaultConfig returns every layer's defaults: the memory store alone (no Layers), the
// rules' default split (not Balanced), no reports. Region (and ID, for reports) are left
// for the caller.
func DefaultConfig() Config {
	return Config{
		Check:    enforcer.DefaultConfig(),
		Lease:    lease.DefaultConfig(),
		Fallback: fallback.DefaultConfig(),
		Quota:    quota.DefaultConfig(),
		Shares:   overrides.DefaultConfig(),
		Usage:    report.DefaultConfig(),
		AckGap:   report.DefaultReporterConfig().AckGap,
	}
}

// ShareFloor is the share floor (Config.Shares.Floor) for a deployment of regions regions:
// the least the balancer's policy leaves a region, overrides.DefaultFloor but at most 2%
// of the limit over the other regions together (pkg/balancer.ReserveTotal). A table that
// has not read the balancer's set enforces at most this, so whatever the balancer gave the
// other regions the sum stays ≤ 1.
func ShareFloor(regions int) float64 {
	f := overrides.DefaultFloor
	if regions > 1 {
		f = min(f, 0.02/float64(regions-1))
	}
	return f
}

// Validate names the first bad setting. The layers' own settings are checked by the
// layers when Build makes them.
func (c *Config) Validate() error {
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: Region is empty", ErrConfig)
	case c.Reports && c.ID == "":
		return fmt.Errorf("%w: ID is empty: reports name the enforcer", ErrConfig)
	case c.Reports && c.AckGap <= 0:
		return fmt.Errorf("%w: AckGap %v, must be > 0", ErrConfig, c.AckGap)
	}
	return nil
}

// normalized is c as Build reads it: the dependency fields cleared, the derived settings
// set.
func (c Config) normalized() Config {
	c.Check.Region, c.Check.Rules, c.Check.Store, c.Check.Clock = c.Region, nil, nil, nil
	c.Check.Logger, c.Check.Registerer, c.Check.Usage, c.Check.Shares, c.Check.Peek = nil, nil, nil, nil, nil
	c.Check.Tracer = nil
	c.Lease.Clock, c.Lease.Peers, c.Lease.Observer, c.Lease.SyncRefill = nil, nil, nil, false
	c.Fallback.Clock, c.Fallback.Peers, c.Fallback.Shard, c.Fallback.Logger = nil, nil, nil, nil
	c.Fallback.Observer, c.Fallback.Inline = nil, false
	c.Shares.Region, c.Shares.Clock, c.Shares.Logger, c.Shares.Registerer = c.Region, nil, nil, nil
	c.Shares.WaitForSet, c.Shares.Reports = c.Balanced, c.Balanced && c.Reports
	c.Usage.RegionalRate = nil
	c.Usage.EarlyGap = min(c.Usage.EarlyGap, c.Usage.Interval)
	return c
}

// Deps are what differs between the processes that build a node.
type Deps struct {
	// Rules serves the rules in force; what feeds it (a file, etcd, a scenario) is the
	// caller's. Required.
	Rules *rules.Holder
	// Store is the bucket store at the bottom: Redis, or a memory store. Closed by its
	// owner, not by the node. Required.
	Store bucket.Store
	// Peek reads bucket levels for explain without taking (bucket.Redis under the
	// layers); nil: Store, when it is a bucket.Peeker.
	Peek bucket.Peeker
	// Shard names the shard that owns an identity, one breaker each (bucket.Redis.ShardOf);
	// nil: one shard.
	Shard func(identity string) string
	// Quotas holds the calendar quota counters (bucket.Redis in production); nil: no
	// quota table, and a calendar quota answers by its rule's fail mode. The table's
	// flusher is a goroutine on Clock: not for Inline (a virtual clock).
	Quotas quota.Counter
	// Peers is N, the live enforcers of the region, that lease batches and local limits
	// are divided by; nil: 1.
	Peers func() int
	// Clock is every part's time source; nil: clock.Real().
	Clock clock.Clock
	// Inline runs the layers' background work inside the call that makes it due (lease
	// refills, the fallback layer's waits): for a virtual clock, which nothing may read
	// from a goroutine of its own.
	Inline bool
	// Logger gets every part's logs, each under its name; nil: none.
	Logger hclog.Logger
	// Registerer is where the check core's and the share table's metrics go, and the
	// report transport's. Required.
	Registerer prometheus.Registerer
	// LeaseObserver and FallbackObserver observe the layers (metrics); nil: none.
	LeaseObserver    lease.Observer
	FallbackObserver fallback.Observer
	// UsageStart is when the usage table's first interval began; zero: Clock's now.
	// regionsim spreads its enforcers' report phases over the interval with it.
	UsageStart time.Time
	// Transport sends the usage reports. Required with Config.Reports.
	Transport Transport
	// Tracing, if not nil, makes every check and every usage report a span (see
	// pkg/tracing); nil: none, and a check pays one nil test for it.
	Tracing trace.TracerProvider
}

// Transport starts the sending of a node's usage reports. Build calls it once with
// everything the node wires filled in: the table, the region and ID, the hooks into the
// share table (Shares, SharesChanged, Accepted), AckGap, Clock, Logger and Registerer.
// The transport adds where and how to send — the app's is report.NewReporter with the
// balancer's addresses and TLS; regionsim's delivers on its virtual clock — and both
// follow report.Schedule.
type Transport func(cfg report.ReporterConfig) (Reporter, error)

// Reporter is a running transport. report.Reporter is one. Close and Leave are
// idempotent; the first of them decides.
type Reporter interface {
	// Close stops reporting.
	Close() error
	// Leave sends a final report (this node enforces nothing any more) and stops.
	Leave() error
}

// Node is one enforcer node, built by Build. Its accessors are safe for concurrent use;
// Close and Leave are idempotent. The zero Node is not usable.
type Node struct {
	cfg   Config // normalized
	clock clock.Clock
	log   hclog.Logger

	enf      *enforcer.Enforcer
	store    bucket.Store    // what the check core takes from
	lease    *lease.Store    // nil without Layers or with NoLease
	fallback *fallback.Store // nil without Layers
	shares   sharesRef
	quotas   *quota.Table // nil without Deps.Quotas
	// quotaRegions joins the quota table to the reports (quotas.go); nil without both.
	quotaRegions *quotaRegions
	usage        *report.Table // nil without Reports
	reporter     Reporter      // nil without Reports
	// fences keeps the region's fenced enforcers' marks: Deps.Store when it is a
	// bucket.Fences (Redis, regionsim's region store) and the node reports; else nil.
	fences bucket.Fences
	// markSeq: the seq the last mark of this node as cut off alone named, the last report
	// it had sent when it marked itself (fence, on the reporter's goroutine; ResetShares
	// clears it with the share table).
	markSeq atomic.Uint64

	once     sync.Once
	closeErr error // Close's result
}

// sharesRef is the share table the node enforces through: one atomic load more than the
// Holder itself, so that ResetShares can swap a new one in.
type sharesRef struct {
	h atomic.Pointer[overrides.Holder]
}

func (r *sharesRef) Share(rule *rules.Compiled, identity string, now time.Time) float64 {
	return r.h.Load().Share(rule, identity, now)
}

// Build composes a node from cfg over deps (see the package doc for the wiring). On an
// error everything it built is closed.
func Build(cfg Config, deps Deps) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case deps.Rules == nil:
		return nil, fmt.Errorf("%w: Deps.Rules is nil", ErrConfig)
	case deps.Store == nil:
		return nil, fmt.Errorf("%w: Deps.Store is nil", ErrConfig)
	case deps.Registerer == nil:
		return nil, fmt.Errorf("%w: Deps.Registerer is nil", ErrConfig)
	case cfg.Reports && deps.Transport == nil:
		return nil, fmt.Errorf("%w: Deps.Transport is nil: reports need one", ErrConfig)
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real()
	}
	if deps.Logger == nil {
		deps.Logger = hclog.NewNullLogger()
	}
	n := &Node{cfg: cfg.normalized(), clock: deps.Clock, log: deps.Logger, store: deps.Store}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	h, err := n.newShares(deps.Registerer)
	if err != nil {
		return nil, err
	}
	n.shares.h.Store(h)
	if n.cfg.Layers {
		if err := n.buildLayers(deps); err != nil {
			return nil, err
		}
	}
	ec := n.cfg.Check
	ec.Rules, ec.Store, ec.Clock, ec.Logger, ec.Registerer = deps.Rules, n.store, n.clock, n.log, deps.Registerer
	ec.Peek = deps.Peek
	if deps.Quotas != nil {
		if deps.Inline {
			return nil, fmt.Errorf("%w: Deps.Quotas with Inline: the quota flusher runs on a goroutine of its own", ErrConfig)
		}
		qc := n.cfg.Quota
		qc.Clock, qc.Logger, qc.Registerer = n.clock, n.log, deps.Registerer
		if n.cfg.Reports {
			// Other regions' counts come back in the answers to the usage reports; a
			// region that hears none for two report intervals holds itself to what the
			// leader then counts it at (the leader's SilentAfter, 2 × its interval).
			n.quotaRegions = &quotaRegions{view: report.NewQuotaView(2*n.cfg.Usage.Interval, qc.MaxEntries)}
			qc.View = n.quotaRegions
		}
		if n.quotas, err = quota.New(deps.Quotas, qc); err != nil {
			return nil, fmt.Errorf("node: quota table: %w", err)
		}
		ec.Quotas = n.quotas
		if n.quotaRegions != nil {
			n.quotaRegions.table = n.quotas
		}
	}
	if deps.Tracing != nil {
		ec.Tracer = deps.Tracing.Tracer("github.com/allot-dev/allot/pkg/enforcer")
	}
	if n.cfg.Balanced {
		ec.Shares = &n.shares
	}
	if n.cfg.Reports {
		uc := n.cfg.Usage
		// The pressure test compares admitted tokens with the allowance this identity has
		// here: its global rate times this node's share of it.
		uc.RegionalRate = n.regionalRate
		start := deps.UsageStart
		if start.IsZero() {
			start = n.clock.Now()
		}
		if n.usage, err = report.NewTable(uc, start); err != nil {
			return nil, fmt.Errorf("node: usage table: %w", err)
		}
		ec.Usage = n.usage
	}
	if n.enf, err = enforcer.New(ec); err != nil {
		return nil, err
	}
	if n.cfg.Reports {
		rc := report.DefaultReporterConfig()
		rc.Table, rc.Region, rc.EnforcerID, rc.AckGap = n.usage, n.cfg.Region, n.cfg.ID, n.cfg.AckGap
		rc.Clock, rc.Logger, rc.Registerer = n.clock, n.log.Named("usage"), deps.Registerer
		rc.Shares, rc.Accepted = n.applied, n.heard
		if f, ok := deps.Store.(bucket.Fences); ok && n.cfg.Balanced {
			n.fences = f
			rc.Fences = n.fence
		}
		rc.SharesChanged = h.Changed()
		if n.quotaRegions != nil {
			rc.Quotas, rc.QuotaView = n.quotaRegions, n.quotaRegions.view
		}
		if deps.Tracing != nil {
			rc.Tracer = deps.Tracing.Tracer("github.com/allot-dev/allot/pkg/enforcer/report")
		}
		if n.reporter, err = deps.Transport(rc); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// newShares builds a share table of the node's settings (metrics on reg, with Balanced).
func (n *Node) newShares(reg prometheus.Registerer) (*overrides.Holder, error) {
	hc := n.cfg.Shares
	hc.Clock, hc.Logger = n.clock, n.log
	if n.cfg.Balanced && reg != nil {
		// Only then: a share age that grows without a balancer to refresh it would page.
		hc.Registerer = reg
	}
	h, err := overrides.NewHolder(hc)
	if err != nil {
		return nil, fmt.Errorf("node: shares: %w", err)
	}
	return h, nil
}

// buildLayers puts fallback → lease over deps.Store.
func (n *Node) buildLayers(deps Deps) (err error) {
	next := deps.Store
	if !n.cfg.NoLease {
		lc := n.cfg.Lease
		lc.Clock, lc.Peers, lc.Observer, lc.SyncRefill = n.clock, deps.Peers, deps.LeaseObserver, deps.Inline
		if lc.ID == "" {
			lc.ID = bucket.SightID(n.cfg.ID)
		}
		if n.lease, err = lease.New(next, lc); err != nil {
			return fmt.Errorf("node: lease: %w", err)
		}
		next = n.lease
	}
	fc := n.cfg.Fallback
	fc.Clock, fc.Peers, fc.Shard, fc.Logger = n.clock, deps.Peers, deps.Shard, n.log.Named("fallback")
	if n.lease != nil {
		fc.Seen = n.lease.Seen
	}
	fc.Observer, fc.Inline = deps.FallbackObserver, deps.Inline
	if n.fallback, err = fallback.New(next, fc); err != nil {
		return fmt.Errorf("node: fallback: %w", err)
	}
	n.store = n.fallback
	return nil
}

// regionalRate is the usage table's RegionalRate: the tokens/s this node allows the
// identity at now, its rule's first global limit × its share here.
func (n *Node) regionalRate(rule *rules.Compiled, identity string, now time.Time) float64 {
	if rule == nil || len(rule.Global) == 0 {
		return 0
	}
	return rule.Global[0].Rate * n.shares.Share(rule, identity, now)
}

// applied is the reports' Shares hook: the share set the node applies.
func (n *Node) applied() (leaderRev int64, version uint64) { return n.shares.h.Load().Applied() }

// heard is the reports' Accepted hook.
func (n *Node) heard(a report.Acceptance) {
	n.shares.h.Load().HeardReport(a.At, a.Seq, a.LeaderRev, a.Version)
}

// FenceTTL is how long an enforcer's mark of itself as fenced counts, in report intervals:
// it marks itself at every report it tries to send, so a mark is renewed about every
// interval while it stays fenced and forgotten this long after it stops (it crashed, or
// is heard again). Its heard time in the store counts twice as long (bucket.Fences).
const FenceTTL = 3

// CutOffAfter is how long, in report intervals, an enforcer goes without an accepted
// report while a region-mate is heard before it fences itself as cut off alone (fence).
const CutOffAfter = 2

// fence is the reports' Fences hook (docs/design.md §9, "An enforcer cut off for long" and
// "Cut off alone"): while the shares this node enforces are stale — the balancer has not
// accepted its reports, or the set has not been refreshed, for the staleness period — or
// it has not loaded its first set yet (it enforces min(default, floor), and the policy
// leaves a region less than the floor when the regions it holds leave no room for
// floors), or it fenced itself as cut off alone, it marks itself fenced in the region's
// store at every report it tries, and takes its mark back at the first report after; it
// returns how many of the region's enforcers are marked (within FenceTTL intervals) and
// the newest marks. Its region-mates' reports carry them: the balancer reserves what a
// fenced enforcer may still enforce (min(last, default), for as long as it serves, however
// long it has been cut off) — per identity for one it released on its mark, the region's
// default share while it counts marks it cannot place — and stops waiting for an
// enforcer it no longer hears once a mark of it names no report before the last of it
// the balancer accepted.
//
// Cut off alone: no report of this enforcer accepted for CutOffAfter intervals, while
// the store says a region-mate's was, more than an interval after this one's last (a
// balancer or network down for the whole region is not such a case: every enforcer's
// last accepted report falls within an interval of the others', and none fences itself
// before Stale). It fences itself first (overrides.Holder.CutOff), then marks itself with
// the seq of the last report it had sent (seq-1: the report being built leaves after the
// mark), directly or to its aggregator. The balancer believes a mark of an enforcer whose
// reports it has accepted none later than the mark names: every report it took was sent
// before the enforcer fenced itself, whether or not the answer got back (a cut that falls
// between the leader's acceptance and the answer's arrival, or an aggregator's forward
// lost). It rejoins, taking its mark back first, once the leader confirmed a report sent
// after its last mark — directly, its answer; behind an aggregator, the leader's heard_seq
// — (the balancer then knows a later seq than any of its marks names, so no mark of it in
// flight is believed) and it applies the newest set the leader had made when it took that
// report, or a newer one (the leader may have raised other regions while it counted this
// enforcer fenced; a leader that does not say: a set read since the cut). Heard again but
// not yet applying that set, it marks itself again naming the last report it sent, so the
// report the leader confirmed is not later than its mark. Which way it errs: under — a
// report or two lost while the region's others get through fences it for about an
// interval more than it needed, and a report sent before the mark but delivered after the
// leader released it makes the leader wait for it again.
//
// A store error counts none and marks nothing (the balancer holds the reservation a while
// past the last count above zero, and waits Stale for an enforcer whose mark it did not
// see; a region whose store is down is on its local limits anyway).
func (n *Node) fence(ctx context.Context, now time.Time, seq uint64) report.Fenced {
	h := n.shares.h.Load()
	iv := n.cfg.Usage.Interval
	heardAt, heard := h.LastHeard()
	cutAt := h.Cut()
	sent := heard // the last report sent before this call (the hook's seq - 1; none said: the last heard)
	if seq > 0 {
		sent = seq - 1
	}
	rejoin := !cutAt.IsZero() && heard > n.markSeq.Load() && h.Current(cutAt)
	cut := !cutAt.IsZero() && !rejoin
	fenced := h.Stale(now) || !h.Loaded() || cut
	call := bucket.FenceCall{ID: bucket.SightID(n.cfg.ID), Fenced: fenced, TTL: FenceTTL * iv, HeardAgo: -1}
	if cut {
		// Only a cut-off enforcer's mark names a seq: it rejoins only after a report sent
		// after the mark was accepted. A stale one's does not (a set read again ends its
		// staleness with no report accepted since its mark). Heard since its mark but not
		// yet applying the leader's set, it names the last report sent now.
		if heard > n.markSeq.Load() {
			n.markSeq.Store(sent) // before the call: the mark may land though the answer does not
		}
		call.Seq = n.markSeq.Load()
	}
	if heard != 0 {
		call.HeardAgo = max(now.Sub(heardAt), 0)
	}
	rep, err := n.fences.Fence(ctx, call)
	if err != nil {
		// It matters when this enforcer is fenced (its region-mates cannot see it); else
		// the store's own errors are logged by the layers that take from it.
		log := n.log.Debug
		if fenced {
			log = n.log.Warn
		}
		log("could not mark or count fenced enforcers in the region's store", "fenced", fenced, "error", err)
		return report.Fenced{}
	}
	if rejoin {
		h.Rejoin() // its mark is gone
	}
	if cutAt.IsZero() && heard != 0 && rep.MateHeardAgo >= 0 &&
		now.Sub(heardAt) >= CutOffAfter*iv && now.Add(-rep.MateHeardAgo).Sub(heardAt) > iv {
		// Cut off alone: fenced first, then marked (a second call, once a cut), naming the
		// last report sent: any the leader took, answered or not, came before the fence.
		h.CutOff(now, heard)
		call.Fenced, call.Seq = true, sent
		n.markSeq.Store(sent)
		if r, err := n.fences.Fence(ctx, call); err == nil {
			rep = r
		} else {
			n.log.Warn("could not mark this enforcer fenced in the region's store", "error", err)
		}
	}
	f := report.Fenced{Seen: uint32(rep.Marked)}
	if len(rep.Marks) > 0 {
		f.Marks = make([]*allotv1.FenceMark, len(rep.Marks))
		for i, m := range rep.Marks {
			f.Marks[i] = &allotv1.FenceMark{Enforcer: m.ID, Seq: m.Seq}
		}
	}
	return f
}

// ResetShares replaces the node's share table with a new one of the same settings: the
// table of an enforcer process that has just started (it has read no set, and hears
// reports from now). regionsim's region-restart uses it for enforcers whose other state
// it keeps; a process that really restarts builds a new Node. The new table's metrics are
// not registered (the first table's are). Its Changed channel is a new one: a transport
// that waits on SharesChanged keeps waiting on the first table's.
func (n *Node) ResetShares() error {
	h, err := n.newShares(nil)
	if err != nil {
		return err
	}
	n.shares.h.Store(h)
	n.markSeq.Store(0)
	return nil
}

// Config returns the settings the node was built with, as Build read them: dependency
// fields cleared, derived settings (the share table's WaitForSet and Reports, the usage
// table's EarlyGap) set.
func (n *Node) Config() Config { return n.cfg }

// Enforcer returns the check core.
func (n *Node) Enforcer() *enforcer.Enforcer { return n.enf }

// Store returns the store the check core takes from: the fallback layer, or Deps.Store.
func (n *Node) Store() bucket.Store { return n.store }

// Lease returns the lease layer (nil without Layers, or with NoLease).
func (n *Node) Lease() *lease.Store { return n.lease }

// Fallback returns the fallback layer (nil without Layers).
func (n *Node) Fallback() *fallback.Store { return n.fallback }

// Quotas returns the calendar quota table, nil without Deps.Quotas.
func (n *Node) Quotas() *quota.Table { return n.quotas }

// Shares returns the share table in force (see ResetShares). Never nil: without Balanced
// it holds no set and gives every identity its default split.
func (n *Node) Shares() *overrides.Holder { return n.shares.h.Load() }

// Usage returns the usage table (nil without Reports).
func (n *Node) Usage() *report.Table { return n.usage }

// Leave sends the final usage report (the node enforces nothing any more: call it after
// the checks have drained) and stops reporting; a node without reports has nothing to
// send. Close still closes the rest.
func (n *Node) Leave() error {
	if n.reporter == nil {
		return nil
	}
	return n.reporter.Leave()
}

// Close stops reporting (without a final report, unless Leave sent it) and closes the
// layers Build made, waiting for their goroutines. Deps.Store is its owner's to close.
// Idempotent.
func (n *Node) Close() error {
	n.once.Do(func() {
		if n.reporter != nil {
			n.closeErr = n.reporter.Close()
		}
		if n.fallback != nil {
			n.fallback.Close()
		}
		if n.lease != nil {
			n.lease.Close()
		}
		if n.quotas != nil {
			_ = n.quotas.Close() // the last batch of counts
		}
	})
	return n.closeErr
}

// The usage table is the check core's observer (pkg/enforcer/report does not import the
// enforcer, so the assertion lives where the two are joined).
var _ enforcer.UsageObserver = (*report.Table)(nil)
