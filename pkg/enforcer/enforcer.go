// Package enforcer decides whether one request may pass: it matches the request's
// attributes against the current rules snapshot and takes tokens for every enforcing rule
// that applies from a bucket.Store (in production fallback → lease → redis).
//
// The front ends (Envoy RLS and allot.v1 over gRPC in pkg/enforcer/grpcapi, JSON and
// forward-auth over HTTP in pkg/enforcer/httpapi) turn their requests into a Request and
// the Decision into their responses and the IETF RateLimit header fields (headers.go).
package enforcer

import (
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/tracing"
	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"
)

// ErrInvalid is wrapped by every error about a check's input; front ends answer it with
// InvalidArgument (gRPC) or 400 (HTTP). The message names the field and the bound.
var ErrInvalid = errors.New("enforcer: invalid check")

// Request is one check: what a gateway knows about a request, and how many requests it
// stands for.
type Request struct {
	Attrs rules.Attrs
	// Hits is how many requests this check stands for; 0 means 1. Each rule takes
	// Hits × its cost for the endpoint.
	Hits int64
	// Replaced names rules (by id) that do not apply to this check because a rule matching
	// another check of the same gateway request replaces them (JoinReplaces fills it).
	Replaced []string
	// Peek asks whether the request would pass now without taking anything (Envoy's
	// hits_addend of 0: "check only"): each enforcing rule's buckets are read
	// (Config.Peek, else the Store when it is a bucket.Peeker) and the decision is the one
	// a take of Hits (0 means 1) × cost would get, with Remaining and Reset the buckets'
	// levels as they are (an identity blocked by the rule's penalty is refused, read with
	// one more read for such rules only). Nothing is taken, nothing is reported as usage. A read the store
	// cannot make is a store error, answered by the rule's fail mode. Under a lease layer
	// the read is of Redis, which does not count the tokens enforcers hold leased: a peek
	// then sees fewer tokens than there are, so it errs under. The read does not pass
	// through pkg/fallback's breakers: while a shard is down a peek waits for the Redis
	// client's own timeout, then the fail mode answers.
	Peek bool
	// Override, when set, takes the place of the descriptor rules (rules.Match.Descriptor)
	// that match the request: it is taken from instead, counted by the request's
	// descriptor (rules.DescriptorIdentity of Attrs.Domain and Attrs.Entries), at cost 1 a
	// hit. The rules of the named dimensions still apply. For Envoy's descriptor limit
	// override (grpcapi.Config.LimitOverrides).
	Override *rules.Compiled
	// Settle asks for a settlement handle (Decision.SettleHandle): Hits is an estimate,
	// and Enforcer.Settle takes or gives back the difference once the actual is known.
	Settle bool
}

// UsageObserver is told the outcome of every enforcing take; it is the seam for
// milestone 2's per-identity usage reports to the balancer. It is called synchronously on
// the checking goroutine, once per enforcing rule that was taken from, so it must be
// quick, must not block and must be safe for concurrent use. tokens is what the request
// asked for (cost × hits); allowed says whether the store granted them; low, that the
// take was granted by the region's store (not a lease or a fallback) and left the
// limiting bucket under half its burst, when that burst is at least DrainMinBurst
// tokens: the region is spending its burst (report.Table tells the balancer, which then
// moves a key under its limit before the region refuses it); now is the check's time
// (the enforcer's clock).
type UsageObserver interface {
	ObserveTake(rule *rules.Compiled, identity string, tokens int64, allowed, low bool, source Source, now time.Time)
}

// DrainMinBurst is the least regional burst, in tokens, whose drain UsageObserver is told
// of (low): under it, half the burst is a clump of a few requests a Poisson stream brings
// by chance, not traffic that outgrew its region's allowance.
const DrainMinBurst = 10

// spendsBurst says whether res, a granted take of the region's store held to lim, left its
// limiting bucket under half its burst (UsageObserver's low).
func spendsBurst(res *bucket.Result, lim *limits) bool {
	if res.Source != SourceRedis && res.Source != SourceMemory || res.Limiting < 0 || res.Limiting >= len(lim.l) {
		return false
	}
	b := lim.l[res.Limiting].Burst
	return b >= DrainMinBurst && 2*float64(res.Remaining) < b
}

// Shares says which part of a rule's global limits one identity may use in this region:
// a share in [0, 1] (pkg/enforcer/overrides.Holder is the production one). It is asked on every take,
// on the checking goroutine, so it must be quick, must not block or allocate, and must be
// safe for concurrent use. An answer equal to rule.Share keeps the compiled limits; any
// other enforces rule.LimitsFor(share) — global rate and burst × share — for that take, on
// every path below the enforcer (the store's script, lease batches, fallback limits are
// all derived from the request's limits). An answer outside [0, 1] (or NaN) is ignored:
// the rule's default share applies.
//
// A decrease bites on the next take: the stores clamp a bucket's tokens to the request's
// burst. An increase adds no tokens at once to a bucket in use: it refills at the new
// rate from what it holds. The stores do not record the limits a bucket was last taken
// under, though, and a bucket idle long enough to be full (a key no longer stored) reads
// as full at the new burst: a region that had not used the identity since before an
// increase of Δ may admit up to Δ × the global burst more, once. The sum over regions of
// what the buckets can hold stays ≤ the global burst (Σ shares ≤ 1).
type Shares interface {
	Share(rule *rules.Compiled, identity string, now time.Time) float64
}

// Enforcer decides checks. Safe for concurrent use; it owns no goroutines, so it needs no
// Close. Build it with New.
//
// Which way it errs: each enforcing rule is one Store.Take, all or nothing within that
// rule's limits, but not across rules: when rule B refuses after rule A granted, A's
// tokens are not returned. To keep that harm on the caller that caused it, takes run from
// the narrowest identity to the broadest (api key, ip, org, endpoint, global) and stop at
// the first refusal — so a refusal by a caller's own per-key rule never spends a shared
// (org, endpoint, global) bucket, and only a refusal by a shared bucket costs the caller
// tokens of its own buckets (at most cost × hits per refused check). The error is under,
// never over: no rule ever admits more than its bucket allows.
type Enforcer struct {
	cfg     Config
	clock   clock.Clock
	real    bool // clock is clock.Real(): latency from the monotonic clock, one read fewer
	log     hclog.Logger
	metrics *metrics
	scratch sync.Pool // *scratch

	peeker     bucket.Peeker        // Config.Peek, else the Store when it is one; nil: peeks fail
	peekSource Source               // the Source a peek's decision names: where peeker reads
	recent     *recentRing          // nil without Config.RecentDecisions
	logTick    atomic.Uint64        // decisions seen, for DecisionLogEvery
	refuseTick atomic.Uint64        // refusals seen, for RefusalLogEvery
	digestKey  []byte               // IdentityDigestKey, or a random one
	tracer     trace.Tracer         // Config.Tracer; nil: no spans
	inflight   bucket.InflightStore // Config.Inflight, or the Store; nil: none
	settler    bucket.Settler       // Config.Settle, or the Store; nil: none
	quotas     *quota.Table         // Config.Quotas; nil: calendar quotas answer by their fail mode
}

type scratch struct {
	matched  []rules.Matched
	req      bucket.Request
	limits   [bucket.MaxLimits]bucket.Limit // a take's limits rescaled by its identity's share
	held     []heldSlot                     // in-flight slots this check holds (inflight.go)
	slotID   string                         // their handle's slot id; "" until one is acquired
	settle   []settleTake                   // takes a settlement handle will name (settle.go)
	reserved []reserved                     // calendar quota counts this check holds (quota.go)
}

// New validates cfg and builds an Enforcer, registering its metrics with cfg.Registerer.
func New(cfg Config) (*Enforcer, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer, cfg.Rules, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("enforcer: while registering metrics: %w", err)
	}
	e := &Enforcer{cfg: cfg, clock: cfg.Clock, real: cfg.Clock == clock.Real(), log: cfg.Logger.Named("enforcer"), metrics: m,
		recent: newRecentRing(cfg.RecentDecisions), tracer: cfg.Tracer}
	e.digestKey = cfg.IdentityDigestKey
	if len(e.digestKey) == 0 {
		e.digestKey = make([]byte, 32)
		_, _ = crand.Read(e.digestKey) // never fails (crypto/rand)
	}
	e.scratch.New = func() any { return &scratch{matched: make([]rules.Matched, 0, 8)} }
	e.peeker, e.peekSource = cfg.Peek, SourceRedis
	if e.peeker == nil {
		e.peeker, _ = cfg.Store.(bucket.Peeker)
		e.peekSource = SourceMemory
		if _, ok := cfg.Store.(*bucket.Redis); ok {
			e.peekSource = SourceRedis
		}
	}
	e.inflight = e.inflightStore()
	e.settler = cfg.Settle
	if e.settler == nil {
		e.settler, _ = cfg.Store.(bucket.Settler)
	}
	e.quotas = cfg.Quotas
	return e, nil
}

// Limits returns the input limits front ends must apply.
func (e *Enforcer) Limits() InputLimits { return e.cfg.Limits }

// Rules returns the holder the enforcer matches against.
func (e *Enforcer) Rules() *rules.Holder { return e.cfg.Rules }

// CountInvalid counts a check a front end rejected as invalid input.
func (e *Enforcer) CountInvalid(api API) {
	if api < numAPIs {
		e.metrics.invalid[api].Inc()
	}
}

// CountGlobalShadow counts a request a front end in global shadow mode admitted although
// a rule refused it.
func (e *Enforcer) CountGlobalShadow(api API) {
	if api < numAPIs {
		e.metrics.globShadow[api].Inc()
	}
}

// Validate checks req against the input limits; the error wraps ErrInvalid and names the
// field, and puts the endpoint in the form rules match (rules.NormalizeEndpoint). Check
// calls it; front ends may call it earlier.
func (e *Enforcer) Validate(req *Request) error {
	l := &e.cfg.Limits
	a := &req.Attrs
	for _, f := range [...]struct {
		name string
		v    string
	}{{"api_key", a.APIKey}, {"plan", a.Plan}, {"org", a.Org}, {"endpoint", a.Endpoint}} {
		if len(f.v) > l.MaxValueLen {
			return fmt.Errorf("%w: %s is %d bytes, more than %d", ErrInvalid, f.name, len(f.v), l.MaxValueLen)
		}
	}
	if req.Hits < 0 || req.Hits > l.MaxHits {
		return fmt.Errorf("%w: hits %d, must be in [0, %d]", ErrInvalid, req.Hits, l.MaxHits)
	}
	if len(a.Entries) > 0 || a.Domain != "" {
		if err := l.validateDescriptor(a); err != nil {
			return err
		}
	}
	// One route, one spelling: "/v1/login/", "//v1/login", "/V1/%6cogin;x" all match rules
	// written for "/v1/login" (rules.NormalizeEndpoint says how).
	// Written only when it changes: a request already normal (most are, and a shared
	// template such as regionsim's) is not written to at all.
	if n := rules.NormalizeEndpoint(a.Endpoint); n != a.Endpoint {
		a.Endpoint = n
	}
	return nil
}

// Check decides one request. It returns an error only for invalid input (wrapping
// ErrInvalid) or when ctx ended before the store answered (ctx.Err()); a refusal is a
// Decision, not an error. A store failure is answered by the rule's fail mode: a
// fail-open rule allows (SourceFailOpen), a fail-closed rule refuses (SourceFailClosed),
// and both are counted in allot_enforcer_store_errors_total.
//
// Shadow rules are evaluated only for requests the enforcing rules allow — as if they were
// one more rule taken last — and never change the decision.
//
// With Config.Tracer the check is a span (trace.go); without, the test below is all
// tracing costs it.
func (e *Enforcer) Check(ctx context.Context, req *Request) (d Decision, err error) {
	if e.tracer != nil {
		var span trace.Span
		ctx, span = e.tracer.Start(ctx, tracing.SpanCheck, checkStart...)
		defer e.endSpan(span, req, &d, &err)
	}
	// One clock read serves the rules match and the latency metric: on some virtual
	// machines a read costs >100 ns, a fifth of a check with the memory store.
	now := e.clock.Now()
	if err := e.Validate(req); err != nil {
		return Decision{}, err
	}
	hits := req.Hits
	if hits == 0 {
		hits = 1
	}
	snap := e.cfg.Rules.Current()
	d = Decision{Allowed: true, Source: SourceNone}
	if snap == nil {
		e.finish(&d, req, nil, now)
		return d, nil
	}
	sc := e.scratch.Get().(*scratch)
	defer e.putScratch(sc)
	sc.matched = snap.Match(&req.Attrs, now, sc.matched[:0])
	if req.Override != nil {
		sc.matched = override(sc.matched, req)
	}
	if snap.HasReplaces() {
		sc.matched = rules.DropReplaced(sc.matched, req.Replaced)
	}
	orderTakes(sc.matched)

	chosen := false // d holds an allowed rule's budget
	for i := range sc.matched {
		m := &sc.matched[i]
		if m.Rule.Mode == rules.ModeShadow {
			if d.Allowed {
				e.shadow(ctx, sc, m, hits, req.Peek, now, &d)
			}
			continue
		}
		if !d.Allowed {
			break
		}
		if len(m.Rule.Calendar) > 0 {
			if err := e.checkQuotas(ctx, sc, m, hits, req.Peek, now, &chosen, &d); err != nil {
				e.abandon(ctx, sc)
				return Decision{}, err
			}
			if !d.Allowed || len(m.Rule.Global) == 0 && m.Rule.Inflight == nil {
				continue
			}
		}
		if m.Rule.Inflight != nil && len(m.Rule.Global) == 0 {
			// A rule of only an in-flight limit: no bucket to take from.
			if err := e.acquire(ctx, sc, m, e.limitsOf(sc, m, now).share, &chosen, &d); err != nil {
				e.abandon(ctx, sc)
				return Decision{}, err
			}
			continue
		}
		var res bucket.Result
		want, ok := tokens(m.Cost, hits)
		lim := e.limitsOf(sc, m, now)
		empty := ok && rules.NoTokens(lim.l)
		var err error
		if ok && !empty {
			if m.Rule.Settle && !req.Peek {
				err = e.takeAfter(ctx, m, lim, want, &res)
			} else {
				err = e.takeOrPeek(ctx, sc, m, lim, want, req.Peek, &res)
			}
		}
		switch {
		case empty:
			// This region holds none of the burst for the identity (its share of it is under
			// one request's cost, docs/design.md §9): refused from memory, and observed as refused
			// demand so the region reports it and the balancer moves a token here.
			// A rule that refuses everything (rules.Rule.Refuse) holds nothing anywhere: no
			// token can be moved, so it is not reported.
			retry := noTokensRetry(m.Rule, want)
			e.fill(&d, m, limits{m.Rule.Global, lim.share}, 0, &bucket.Result{Reset: retry, RetryAfter: retry})
			d.Allowed, d.Source, d.Remaining, d.Quota = false, SourceRefusalCache, 0, 0
			if !m.Rule.Refuses() && !req.Peek {
				e.observeUsage(m, want, false, false, SourceRefusalCache, now)
			}
			continue
		case !ok || errors.Is(err, bucket.ErrInvalid):
			// Only the cost can make a compiled rule's request invalid: it can never fit.
			e.fill(&d, m, lim, 0, &bucket.Result{})
			d.Allowed, d.Source, d.RetryAfter = false, SourceTooLarge, 0
		case err != nil:
			if ctxErr := ctx.Err(); ctxErr != nil {
				e.abandon(ctx, sc)
				return Decision{}, ctxErr
			}
			// The one place the fail mode is decided. A layer that knows when the store will
			// next be tried (pkg/fallback: ErrUnavailable, until the shard's probe) says so in
			// res.RetryAfter; any other error gets FailClosedRetryAfter.
			e.metrics.storeErrors[m.Rule.FailMode&1].Inc()
			if !errors.Is(err, bucket.ErrUnavailable) { // pkg/fallback logs its shard's transitions
				e.log.Warn("store could not answer", "rule", m.Rule.ID, "fail-mode", failModeName(m.Rule.FailMode), "error", err)
			}
			if m.Rule.FailMode == rules.FailClosed {
				retry := e.cfg.FailClosedRetryAfter
				if errors.Is(err, bucket.ErrUnavailable) && res.RetryAfter > 0 {
					retry = res.RetryAfter
				}
				e.fill(&d, m, lim, 0, &bucket.Result{Reset: retry})
				d.Allowed, d.Source, d.RetryAfter = false, SourceFailClosed, retry
			} else if !chosen && d.Rule == "" {
				// Budget unknown: say the quota is whole rather than invent a shortage.
				e.fill(&d, m, lim, 0, &bucket.Result{})
				d.Remaining, d.Source = d.Quota, SourceFailOpen
			}
			if !req.Peek {
				e.observeUsage(m, want, m.Rule.FailMode != rules.FailClosed, false, d.Source, now)
			}
			continue
		case !res.Allowed():
			e.fill(&d, m, lim, res.Limiting, &res)
			d.Allowed = false
		case !chosen || res.Remaining < d.Remaining:
			e.fill(&d, m, lim, res.Limiting, &res)
			d.RetryAfter = 0
			chosen = true
		}
		if ok && err == nil && !req.Peek {
			e.observeUsage(m, want, res.Allowed(), res.Allowed() && spendsBurst(&res, &lim), res.Source, now)
			if req.Settle && res.Allowed() && d.Allowed {
				sc.settle = append(sc.settle, settleTake{rule: m.Rule.ID, identity: m.Identity, want: want, cost: max(m.Cost, 1)})
			}
		}
		if m.Rule.Inflight != nil && !req.Peek && d.Allowed && ok && err == nil && res.Allowed() {
			if err := e.acquire(ctx, sc, m, lim.share, &chosen, &d); err != nil {
				e.abandon(ctx, sc)
				return Decision{}, err
			}
		}
	}
	e.finishHeld(ctx, sc, &d)
	if req.Settle {
		e.finishSettle(ctx, sc, &d)
	}
	if len(sc.reserved) > 0 { // tested here: a check without quotas makes no call
		e.finishQuotas(sc, &d)
	}
	e.finish(&d, req, snap, now)
	return d, nil
}

// override drops the descriptor rules from ms and adds req.Override in their place.
func override(ms []rules.Matched, req *Request) []rules.Matched {
	out := ms[:0]
	for i := range ms {
		if len(ms[i].Rule.Match.Descriptor) == 0 {
			out = append(out, ms[i])
		}
	}
	clear(ms[len(out):])
	id := rules.DescriptorIdentity(req.Attrs.Domain, req.Attrs.Entries, nil)
	return append(out, rules.Matched{Rule: req.Override, Identity: id, Cost: 1})
}

// abandon gives back what a check that ends in an error holds: its in-flight slots and
// its calendar quota counts.
func (e *Enforcer) abandon(ctx context.Context, sc *scratch) {
	e.finishHeld(ctx, sc, &Decision{})
	e.finishQuotas(sc, &Decision{})
}

func (e *Enforcer) putScratch(sc *scratch) {
	clear(sc.matched)
	sc.matched = sc.matched[:0]
	sc.req = bucket.Request{}
	if sc.held != nil {
		clear(sc.held)
		sc.held, sc.slotID = sc.held[:0], ""
	}
	if sc.settle != nil {
		clear(sc.settle)
		sc.settle = sc.settle[:0]
	}
	if sc.reserved != nil {
		clear(sc.reserved)
		sc.reserved = sc.reserved[:0]
	}
	e.scratch.Put(sc)
}

// limits is what one take of one identity is held to.
type limits struct {
	l     []bucket.Limit
	share float64
}

// limitsOf returns the limits m's identity is held to in this region and the share they
// stand for: the rule's compiled limits (its default share), or its global limits × the
// identity's share when Shares says otherwise, built in sc (valid until the next call on
// sc; no allocation).
func (e *Enforcer) limitsOf(sc *scratch, m *rules.Matched, now time.Time) limits {
	def := limits{m.Rule.Limits, m.Rule.Share}
	if e.cfg.Shares == nil {
		return def
	}
	s := e.cfg.Shares.Share(m.Rule, m.Identity, now)
	if s == m.Rule.Share || !(s >= 0 && s <= 1) || len(m.Rule.Global) > len(sc.limits) {
		return def
	}
	return limits{m.Rule.LimitsFor(s, sc.limits[:0]), s}
}

// noTokensRetry is the Retry-After of a refusal by a region that holds none of a rule's
// burst: how long the global limit takes to refill want tokens (its slowest limit), at
// least a second — about when a token can have been moved here.
func noTokensRetry(rule *rules.Compiled, want int64) time.Duration {
	secs := 1.0
	for _, g := range rule.Global {
		if g.Rate > 0 {
			secs = max(secs, float64(want)/g.Rate)
		}
	}
	return time.Duration(min(secs, 86400) * float64(time.Second))
}

// take asks the store for want tokens from every limit in lim (m's rule's limits for
// this identity), all or nothing.
func (e *Enforcer) take(ctx context.Context, sc *scratch, m *rules.Matched, lim limits, want int64, res *bucket.Result) error {
	sc.req = bucket.Request{
		Identity:   m.Identity,
		Limits:     lim.l,
		Want:       want,
		Min:        want,
		FailClosed: m.Rule.FailMode == rules.FailClosed,
		Penalty:    m.Rule.Penalty,
	}
	r, err := e.cfg.Store.Take(ctx, &sc.req)
	*res = r
	return err
}

// errNoPeek is a peek's error when the store cannot be read without taking.
var errNoPeek = errors.New("enforcer: the store cannot be read without taking (no bucket.Peeker)")

// takeOrPeek takes want tokens (take), or with peek reads the buckets and decides as a
// take of want would, taking nothing (Request.Peek).
func (e *Enforcer) takeOrPeek(ctx context.Context, sc *scratch, m *rules.Matched, lim limits, want int64, peek bool, res *bucket.Result) error {
	if peek {
		return e.peek(ctx, m, lim, want, res)
	}
	return e.take(ctx, sc, m, lim, want, res)
}

// peek reads m's buckets and decides as a take of want would, taking nothing.
func (e *Enforcer) peek(ctx context.Context, m *rules.Matched, lim limits, want int64, res *bucket.Result) error {
	if e.peeker == nil {
		return errNoPeek
	}
	if n := len(lim.l); n == 0 || n > bucket.MaxLimits || float64(want) > minBurst(lim.l) {
		return bucket.ErrInvalid // as a take would be: it could never be granted
	}
	if p := m.Rule.Penalty; p != nil {
		// A blocked identity is refused whatever its buckets hold, as a take would be
		// (one more read, for rules with a penalty only).
		if pp, ok := e.peeker.(bucket.PenaltyPeeker); ok {
			st, now, err := pp.PeekPenalty(ctx, m.Identity, p)
			if err != nil {
				return err
			}
			if st.Blocked(now) {
				d := time.Duration(st.Until-now) * time.Microsecond
				*res = bucket.Result{RetryAfter: d, Reset: d, Source: e.peekSource, Penalized: true, PenaltyCount: st.Count}
				return nil
			}
		}
	}
	var got, left [bucket.MaxLimits]float64
	levels, err := e.peeker.Peek(ctx, m.Identity, lim.l, got[:0])
	if err != nil {
		return err
	}
	if len(levels) != len(lim.l) {
		return fmt.Errorf("enforcer: peek read %d buckets, want %d", len(levels), len(lim.l))
	}
	copy(left[:], levels)
	d := bucket.Decide(lim.l, left[:len(levels)], want, want)
	*res = bucket.ResultOf(d, e.peekSource)
	if d.Granted > 0 { // nothing was taken: the levels as they are
		i := d.Limiting
		res.Remaining = int64(math.Max(0, math.Floor(levels[i]+1e-9)))
		res.Reset = time.Duration(lim.l[i].MicrosUntil(levels[i], lim.l[i].Burst)) * time.Microsecond
	}
	return nil
}

func minBurst(ls []bucket.Limit) float64 {
	b := math.Inf(1)
	for i := range ls {
		b = min(b, ls[i].Burst)
	}
	return b
}

// shadow evaluates one shadow rule and notes a "would refuse" in d; it never changes
// whether d allows.
func (e *Enforcer) shadow(ctx context.Context, sc *scratch, m *rules.Matched, hits int64, peek bool, now time.Time, d *Decision) {
	if len(m.Rule.Calendar) > 0 && !peek && e.quotas != nil {
		if want, ok := tokens(m.Cost, hits); ok {
			for i := range m.Rule.Calendar {
				res, err := e.quotas.Reserve(ctx, m.Identity, &m.Rule.Calendar[i], want, false, now)
				if err == nil && !res.Allowed {
					e.metrics.shadow[shadowRefuse].Inc()
					d.addShadow(m.Rule.ID)
					return
				}
			}
		}
	}
	if len(m.Rule.Global) == 0 {
		return // only an in-flight limit or quotas: no bucket to take from
	}
	want, ok := tokens(m.Cost, hits)
	var res bucket.Result
	var err error
	lim := e.limitsOf(sc, m, now)
	empty := ok && rules.NoTokens(lim.l)
	if ok && !empty {
		err = e.takeOrPeek(ctx, sc, m, lim, want, peek, &res)
	}
	switch {
	case empty:
		e.metrics.shadow[shadowRefuse].Inc()
		d.addShadow(m.Rule.ID)
		return
	case ok && err != nil && !errors.Is(err, bucket.ErrInvalid):
		e.metrics.shadow[shadowError].Inc()
		return
	case !ok || err != nil || !res.Allowed():
		e.metrics.shadow[shadowRefuse].Inc()
		d.addShadow(m.Rule.ID)
		if n := e.cfg.RefusalLogEvery; n > 0 && e.refuseTick.Add(1)%n == 1%n {
			e.log.Info("shadow rule would refuse", "region", e.cfg.Region, "rule", m.Rule.ID,
				"source", SourceShadow.String(), "store-source", res.Source.String(),
				"retry-after", res.RetryAfter)
		}
	default:
		e.metrics.shadow[shadowAllow].Inc()
	}
}

// fill makes m's rule, limit i of lim (the limits the take was held to) and res the
// deciding budget of d.
func (e *Enforcer) fill(d *Decision, m *rules.Matched, lim limits, i int, res *bucket.Result) {
	if i < 0 || i >= len(lim.l) {
		i = 0
	}
	l := &lim.l[i]
	d.Rule, d.Limit, d.Share, d.CountedBy = m.Rule.ID, l.Name, lim.share, rules.CountedBy(m.Identity)
	d.quota = m.Rule.Quota
	d.identity = m.Identity
	d.Quota, d.Window = quotaWindow(l)
	d.Remaining = res.Remaining
	d.Reset = res.Reset + jitter(m.Identity, res.Reset, e.cfg.ResetJitterMax, e.cfg.ResetJitterRatio)
	eff := effectiveWindow(res.Remaining, l.Rate)
	d.Effective = eff + jitter(m.Identity, eff, e.cfg.ResetJitterMax, e.cfg.ResetJitterRatio)
	d.RetryAfter = res.RetryAfter
	d.Source = res.Source
	d.Penalized = res.Penalized
}

func (e *Enforcer) observeUsage(m *rules.Matched, want int64, allowed, low bool, src Source, now time.Time) {
	e.recent.add(m.Identity, m.Rule.ID, allowed, src, now)
	if e.cfg.Usage != nil {
		e.cfg.Usage.ObserveTake(m.Rule, m.Identity, want, allowed, low, src, now)
	}
}

// finish records metrics and the sampled decision logs of a check decided under snap.
func (e *Enforcer) finish(d *Decision, req *Request, snap *rules.Snapshot, start time.Time) {
	var took time.Duration
	if e.real {
		took = time.Since(start) // monotonic: no wall-clock read
	} else {
		took = e.clock.Now().Sub(start)
	}
	e.metrics.observe(d, snap, req.Attrs.Plan, took)
	if !d.Allowed {
		if n := e.cfg.RefusalLogEvery; n > 0 && e.refuseTick.Add(1)%n == 1%n {
			kv := []any{"region", e.cfg.Region, "rule", d.Rule, "limit", d.Limit,
				"source", d.Source.String(), "endpoint", req.Attrs.Endpoint,
				"retry-after", d.RetryAfter, "remaining", d.Remaining,
				"counted-by", d.CountedBy, "identity-digest", e.digest(d.identity)}
			if e.cfg.LogIdentities {
				kv = append(kv, "identity", d.identity)
			}
			e.log.Info("refused", kv...)
		}
		return
	}
	if n := e.cfg.DecisionLogEvery; n > 0 && e.log.IsDebug() && e.logTick.Add(1)%n == 1%n {
		e.log.Debug("allowed", "region", e.cfg.Region, "rule", d.Rule, "limit", d.Limit,
			"source", d.Source.String(), "endpoint", req.Attrs.Endpoint, "remaining", d.Remaining)
	}
}

// tokens returns cost × hits, and false when that cannot be asked for (overflow or a
// non-positive cost).
func tokens(cost, hits int64) (int64, bool) {
	if cost < 1 {
		cost = 1
	}
	if cost > math.MaxInt64/hits {
		return 0, false
	}
	return cost * hits, true
}

// orderTakes sorts matched rules so enforcing rules come first, narrowest identity first
// (the order of rules.By: api key, ip, org, endpoint, global, then descriptor rules
// counted by descriptor, whose breadth their values decide), shadow rules last; stable,
// so the snapshot's order breaks ties. Insertion sort: a request matches a handful of
// rules and this must not allocate.
func orderTakes(ms []rules.Matched) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && takeRank(&ms[j]) < takeRank(&ms[j-1]); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

func takeRank(m *rules.Matched) int {
	r := int(m.Rule.By)
	if m.Rule.Mode == rules.ModeShadow {
		r += 1 << 8
	}
	return r
}

func failModeName(f rules.FailMode) string {
	if f == rules.FailClosed {
		return "closed"
	}
	return "open"
}

// digest is the identity's digest in the refusal logs: the first 8 bytes of
// HMAC-SHA256(digestKey, identity), hex. Stable for one key (Config.IdentityDigestKey);
// not reversible without it, even over the few billion IPv4 addresses.
func (e *Enforcer) digest(identity string) string {
	if identity == "" {
		return ""
	}
	h := hmac.New(sha256.New, e.digestKey)
	h.Write([]byte(identity))
	return hex.EncodeToString(h.Sum(nil)[:8])
}
