package enforcer

import (
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// InputLimits bound what one check may carry. Front ends check them before anything else
// and answer InvalidArgument (gRPC) or 400 (HTTP) with a message naming the field and the
// bound; nothing over them reaches the rules or the store.
type InputLimits struct {
	// MaxDescriptors is the most descriptors one Envoy RLS request may carry.
	MaxDescriptors int
	// MaxEntries is the most entries one descriptor may carry.
	MaxEntries int
	// MaxKeyLen is the longest descriptor entry key, in bytes.
	MaxKeyLen int
	// MaxValueLen is the longest attribute or descriptor value (API key, endpoint, ...),
	// in bytes. It keeps identities ("key:<api key>") under bucket.MaxIdentityLen.
	MaxValueLen int
	// MaxDomainLen is the longest Envoy RLS domain, in bytes.
	MaxDomainLen int
	// MaxHits is the most hits one check may stand for.
	MaxHits int64
}

// DefaultInputLimits are generous for real gateways and small enough that a hostile
// caller cannot make a check expensive.
func DefaultInputLimits() InputLimits {
	return InputLimits{
		MaxDescriptors: 8,
		MaxEntries:     8,
		MaxKeyLen:      64,
		MaxValueLen:    256,
		MaxDomainLen:   128,
		MaxHits:        1000,
	}
}

// Validate names the first bad bound.
func (l InputLimits) Validate() error {
	switch {
	case l.MaxDescriptors < 1 || l.MaxDescriptors > 64:
		return fmt.Errorf("enforcer: input limits: max descriptors %d, must be in [1, 64]", l.MaxDescriptors)
	case l.MaxEntries < 1 || l.MaxEntries > 64:
		return fmt.Errorf("enforcer: input limits: max entries %d, must be in [1, 64]", l.MaxEntries)
	case l.MaxKeyLen < 1 || l.MaxKeyLen > 1024:
		return fmt.Errorf("enforcer: input limits: max key length %d, must be in [1, 1024]", l.MaxKeyLen)
	case l.MaxValueLen < 1 || l.MaxValueLen > bucket.MaxIdentityLen-16:
		return fmt.Errorf("enforcer: input limits: max value length %d, must be in [1, %d]", l.MaxValueLen, bucket.MaxIdentityLen-16)
	case l.MaxDomainLen < 1 || l.MaxDomainLen > 1024:
		return fmt.Errorf("enforcer: input limits: max domain length %d, must be in [1, 1024]", l.MaxDomainLen)
	case l.MaxHits < 1 || l.MaxHits > 1e6:
		return fmt.Errorf("enforcer: input limits: max hits %d, must be in [1, 1000000]", l.MaxHits)
	}
	return nil
}

// Config configures an Enforcer. Start from DefaultConfig and set the dependencies
// (Rules, Store, Registerer); the zero value is not valid.
type Config struct {
	// Region names this enforcer's region (logs, decision logs). Required.
	Region string
	// Rules serves the current rules snapshot. Required.
	Rules *rules.Holder
	// Store takes tokens: in production the stack fallback → lease → redis, built by the
	// caller. Required.
	Store bucket.Store
	// Inflight holds the slots of in-flight limits (in production fallback → redis: leases
	// do not apply); nil means the Store itself when it is a bucket.InflightStore, and
	// without either an in-flight limit answers as a failed store (by its fail mode).
	Inflight bucket.InflightStore
	// Settle records settlement markers and settles costs after the response
	// (Request.Settle, Enforcer.Settle; in production the Store's stack: fallback → lease
	// → redis, settling in Redis); nil means the Store itself when it is a bucket.Settler,
	// and without either a check asking to settle gets no handle.
	Settle bucket.Settler
	// SettleWindow is how long a check's settlement handle may be settled
	// (Request.Settle): after it the estimate stands. In [1s, 24h]; default 10 min.
	SettleWindow time.Duration
	// Quotas counts calendar quotas (rules.CalendarQuota) in memory and flushes them to
	// their counters in batches (pkg/quota); the caller owns it and closes it after the
	// enforcer's last check. nil: a calendar quota answers as a failed store (by its
	// fail mode).
	Quotas *quota.Table
	// Clock tells the time rules are matched at (expiring overrides). Default clock.Real().
	Clock clock.Clock
	// Logger receives decision logs and store errors. Default hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer is where the enforcer's metrics are registered; never the global one by
	// default. Required (use prometheus.NewRegistry() in tests).
	Registerer prometheus.Registerer
	// Usage, if set, is told the outcome of every enforcing take (milestone 2's usage
	// reports). Nil means no one listens.
	Usage UsageObserver
	// Shares, if set, gives each identity's share of a rule's global limits in this region
	// (the balancer's, pkg/enforcer/overrides); nil means every identity has its rule's default share
	// (rules.Compiled.Share, the limits the rule was compiled with).
	Shares Shares

	// Limits bound the input of one check.
	Limits InputLimits

	// ResetJitterMax and ResetJitterRatio bound the per-key jitter added to reset times:
	// a key's reset is reported later by f × min(ResetJitterMax, ResetJitterRatio × reset),
	// where f in [0, 1) is fixed per identity. Never earlier. Both 0 disable jitter.
	ResetJitterMax   time.Duration
	ResetJitterRatio float64

	// FailClosedRetryAfter is the Retry-After given when a fail-closed rule refuses because
	// the store could not answer and did not say when it will next be tried (pkg/fallback
	// does, with bucket.ErrUnavailable: until the shard's probe, and that is given instead).
	FailClosedRetryAfter time.Duration

	// DecisionLogEvery logs one decision in every N at debug level (0: none).
	// RefusalLogEvery logs one refusal in every N at info level (0: none); shadow
	// "would refuse" outcomes share this sampler.
	DecisionLogEvery uint64
	RefusalLogEvery  uint64
	// IdentityDigestKey keys the identity digest the sampled refusal logs carry
	// ("identity-digest": the first 8 bytes of HMAC-SHA256(key, identity), in hex), so an
	// operator can tell one caller from many without the log naming it: without the key
	// the digest cannot be reversed, even for an IP address. Give every enforcer the same
	// key for digests that match across the fleet; empty: a random key per process (digests
	// then match within one enforcer's log only).
	IdentityDigestKey []byte
	// LogIdentities adds the identity itself ("identity": "key:…", "ip:…") to the sampled
	// refusal logs, where the operator allows keys and addresses in logs.
	LogIdentities bool

	// RecentDecisions is how many recent takes (identity, rule, source, outcome) the
	// enforcer keeps for Explain, in a ring by identity (0: none). Recording one costs a
	// shard lock and no allocation.
	RecentDecisions int
	// Peek, if set, reads bucket levels for Explain without taking (bucket.Redis under a
	// fallback → lease stack); nil means the Store itself when it is a bucket.Peeker.
	Peek bucket.Peeker

	// Tracer, if set, starts a span per check (tracing.SpanCheck, a child of any span in
	// the check's context: front ends put the gateway's there), which its provider's
	// sampler samples; a sampled span names the deciding rule, limit, source and verdict
	// and the identity by its digest (IdentityDigestKey), never in clear. nil: no spans,
	// and a check pays one nil test for it.
	Tracer trace.Tracer
}

// DefaultConfig returns a Config with every tunable set; the dependencies (Region, Rules,
// Store, Registerer) are left for the caller.
func DefaultConfig() Config {
	return Config{
		Clock:                clock.Real(),
		Limits:               DefaultInputLimits(),
		ResetJitterMax:       time.Second,
		ResetJitterRatio:     0.1,
		FailClosedRetryAfter: time.Second,
		DecisionLogEvery:     10000,
		RefusalLogEvery:      100,
		RecentDecisions:      1024,
		SettleWindow:         10 * time.Minute,
	}
}

// Validate names the first missing dependency or bad value.
func (c *Config) Validate() error {
	switch {
	case c.Region == "":
		return errors.New("enforcer: config: region is empty")
	case c.Rules == nil:
		return errors.New("enforcer: config: rules holder is nil")
	case c.Store == nil:
		return errors.New("enforcer: config: store is nil")
	case c.Registerer == nil:
		return errors.New("enforcer: config: registerer is nil (pass prometheus.NewRegistry())")
	case c.ResetJitterMax < 0 || c.ResetJitterMax > time.Minute:
		return fmt.Errorf("enforcer: config: reset jitter max %v, must be in [0, 1m]", c.ResetJitterMax)
	case !(c.ResetJitterRatio >= 0 && c.ResetJitterRatio <= 0.5):
		return fmt.Errorf("enforcer: config: reset jitter ratio %g, must be in [0, 0.5]", c.ResetJitterRatio)
	case c.FailClosedRetryAfter < 0 || c.FailClosedRetryAfter > time.Hour:
		return fmt.Errorf("enforcer: config: fail-closed retry-after %v, must be in [0, 1h]", c.FailClosedRetryAfter)
	case c.SettleWindow < time.Second || c.SettleWindow > 24*time.Hour:
		return fmt.Errorf("enforcer: config: settle window %v, must be in [1s, 24h]", c.SettleWindow)
	case c.RecentDecisions < 0 || c.RecentDecisions > 1<<20:
		return fmt.Errorf("enforcer: config: recent decisions %d, must be in [0, %d]", c.RecentDecisions, 1<<20)
	}
	return c.Limits.Validate()
}
