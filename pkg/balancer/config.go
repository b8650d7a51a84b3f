package balancer

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/share"
)

// Limits is what a core needs to know of one limited identity's rule.
type Limits struct {
	// Rate is the rule's binding global rate in tokens/s (> 0): demand is judged against
	// it. Every limit of a rule takes the same tokens per request and a share scales them
	// all, so the limit that binds a steady demand is the one with the smallest rate
	// (per second: a per-minute limit's Rate/Per) — RuleTable gives that one.
	Rate float64
	// Requests is how many requests of the rule's largest cost its global burst holds
	// (the smallest burst ÷ the largest cost); 0: unknown. Below SmallBurst the core hands
	// the identity's shares out in whole requests of the burst (see quantise), since an
	// enforcer holds none of a burst it has less than one request of.
	Requests float64
	// Default is the default split, one share per region in CoreConfig.Regions order,
	// summing to ≤ 1; nil means the split from CoreConfig.Weights.
	Default []float64
	// Global is the rule's global limits, unscaled (nil: unknown). A report's admitted
	// count for the identity is believed up to MaxAdmitted.
	Global []bucket.Limit
}

// ClaimLead is how much longer than the interval a report covers MaxAdmitted counts
// refill for: leases drawn before the interval and spent in it, and a Redis outage's
// local limits, which may admit past the global limit (see docs/design.md §10).
const ClaimLead = 10 * time.Second

// MaxAdmitted is the most tokens one enforcer can have admitted for the identity over an
// interval of secs seconds, whatever its region's share: its region's enforcers draw on
// one bucket per limit, so each limit admits at most its burst plus its refill (over the
// interval and ClaimLead). A report claiming more is not true (issue 27: an enforcer's
// certificate in an attacker's hands); the balancer believes that much of it. +Inf when
// the limits are unknown. Which way it errs: toward believing — a claim up to about
// twice what the limits allow over a 10 s interval passes.
func (l Limits) MaxAdmitted(secs float64) float64 {
	m := math.Inf(1)
	for _, g := range l.Global {
		m = min(m, g.Rate*(max(secs, 0)+ClaimLead.Seconds())+g.Burst)
	}
	return m
}

// LimitsFunc tells the core one limited identity's Limits. ok is false when the rule is
// unknown: the identity is ignored (and counted, Stats.UnknownRule). The core keeps the
// returned Default and never modifies it, so one slice per rule may be shared by every
// identity of that rule; the function must not modify it afterwards either. It is called
// with the core's mutex held: it must not call back into the Core.
type LimitsFunc func(rule, identity string) (l Limits, ok bool)

// CoreConfig configures a Core. The zero value is not valid: start from DefaultCoreConfig
// and set Regions and Limits.
type CoreConfig struct {
	// Regions are the regions shares are allocated between; their order is the index of
	// every per-region slice (share.Input, LimitsFunc's default split, Stats). Required,
	// unique names like "us-east".
	Regions []string
	// Weights give the default split of an identity whose LimitsFunc returns no split:
	// share_r = Weights[r] / Σ Weights. nil: equal. Each > 0, one per region.
	Weights []float64
	// LeaderRev is this leadership term's fencing token (the election key's create
	// revision), written into every Publication's head. > 0. A core lives for one term:
	// a replica that becomes leader again builds a new Core.
	LeaderRev int64

	// Interval is the balancing interval: shares are recomputed every Interval (and
	// sooner when a report shows a key's traffic moved, see ShiftGap). Default 10s, like
	// the enforcers' report interval.
	Interval time.Duration
	// EarlyGap is the longest a recompute's follow-up waits for every enforcer to answer
	// its version (see Core.followUp). Default 2s.
	EarlyGap time.Duration
	// ShiftGap is the least time between two recomputes when a report's recent rates show
	// a key's traffic moved beyond the noise (see Core.shifted); that recompute reads the
	// moved keys' demand from the recent rates and its version does not wait for
	// MinVersionGap. Default 500ms.
	ShiftGap time.Duration
	// Learning: a new core (a new leader) does not reallocate until every region has
	// reported or Learning has passed since its first call, so it does not move shares on
	// one region's word. Default 2 × Interval.
	Learning time.Duration
	// AckTimeout is the margin past Stale after which a region none of whose enforcers
	// reported is taken to enforce at most the default split (its enforcers have gone
	// stale by their own clocks): it covers a report's round trip, since an enforcer
	// counts its staleness from when its last report was answered. Decreases are
	// otherwise acknowledged only by the reports of the region's enforcers, never by
	// time. Default 5s.
	AckTimeout time.Duration
	// MinVersionGap is the least time between two new versions (a retried write aside).
	// A version rewrites the chunks whose entries changed (every chunk at worst), so with
	// it the bytes written per Interval are at most (Interval/MinVersionGap + 1) ×
	// MaxPublished × ~150 B, and about the changed entries' chunks × 16 KiB when few
	// change (contract.Chunker). Two kinds of version go out as soon as they are due,
	// without the gap: a plan's continuation (the increases held back until the reports
	// acknowledged the decreases) and the result of a recompute a shift asked for (at
	// most one per ShiftGap). Default 2s.
	MinVersionGap time.Duration
	// StepGap is the least time between two versions of those two kinds. The service
	// ticks the core at once on every early or acknowledging report (Service's kick), and
	// a version's acknowledgements arrive one by one over about the enforcers' AckGap:
	// without it each one that completed some key's plan wrote a version of its own, which
	// every enforcer acknowledges again (regionsim's 10,000 keys: 11.9 versions an
	// interval instead of 8.2; TestStepsAtMostEveryStepGap). Default 250ms; at most
	// MinVersionGap.
	StepGap time.Duration
	// SilentAfter: a region none of whose enforcers reported for this long is silent: it
	// is held at its last share (others get no more than the rest) and only its own
	// reports acknowledge its decreases. An enforcer counts for
	// acknowledgements until it has fenced itself (Stale + AckTimeout after its last
	// report), not only for SilentAfter. Default 2 × Interval.
	SilentAfter time.Duration
	// Stale is the enforcers' staleness period: a region silent for Stale is then held at
	// min(last, default), which is what its enforcers fall back to on their own after
	// Stale without a refresh. Default 5m.
	Stale time.Duration
	// KeyTTL: an identity absent from every report for KeyTTL goes back to the default
	// split (through the change plan), then is forgotten. Default 1m.
	KeyTTL time.Duration

	// MaxEntries caps a report's usage entries; a longer report is refused whole.
	// Default 10,000.
	MaxEntries int
	// MaxIdentities caps the identities tracked. Past it, recompute evicts the least
	// demanded (they go back to the default split through the plan, then are forgotten)
	// of the regions holding more than MaxIdentities / regions of them, never taking a
	// region below that part; between recomputes each region may add (MaxIdentities/8) /
	// regions new identities past MaxIdentities, and none past MaxIdentities +
	// MaxIdentities/8 (Stats.Dropped). So one region's flood of invented identities
	// displaces only that region's. Default 2,000,000.
	MaxIdentities int
	// MaxPublished caps the identities a publication lists (those whose shares differ from
	// the default split), so the bytes written per interval are bounded whatever the key
	// count (≈ 150 bytes an entry). Past it the least-demanded identities are moved back to
	// the default split, of the regions with more than MaxPublished / regions of them (as
	// for MaxIdentities). In-flight changes may exceed it briefly. Default 50,000.
	MaxPublished int
	// MaxEnforcers caps the enforcers tracked per region (ack state, dedupe); reports from
	// more are refused. Default 4,096.
	MaxEnforcers int
	// MaxQuotaEntries caps the calendar quotas the leader keeps counts of (quota.go); past
	// it, quotas no report named for an hour are forgotten, then new ones go unanswered
	// (Stats.QuotaRefused). About 300 bytes each. Default 200,000.
	MaxQuotaEntries int

	// Share configures the policy (pkg/share). Share.Floor × len(Regions) must be ≤ 1;
	// the core uses min(Share.Floor, ReserveTotal / (regions − 1)).
	Share share.Config
	// Limits gives each identity's binding global rate, burst in requests and default
	// split. Required.
	Limits LimitsFunc
}

// DefaultCoreConfig returns the defaults above, with LeaderRev 1 and no regions.
func DefaultCoreConfig() CoreConfig {
	return CoreConfig{
		LeaderRev:       1,
		Interval:        10 * time.Second,
		EarlyGap:        2 * time.Second,
		ShiftGap:        500 * time.Millisecond,
		Learning:        20 * time.Second,
		AckTimeout:      5 * time.Second,
		MinVersionGap:   2 * time.Second,
		StepGap:         250 * time.Millisecond,
		SilentAfter:     20 * time.Second,
		Stale:           5 * time.Minute,
		KeyTTL:          time.Minute,
		MaxEntries:      10_000,
		MaxIdentities:   2_000_000,
		MaxPublished:    50_000,
		MaxEnforcers:    4096,
		MaxQuotaEntries: 200_000,
		Share:           share.DefaultConfig(),
	}
}

var regionRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Validate names the first bad field and value (all of them, joined).
func (c *CoreConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("balancer: CoreConfig."+format, a...)) }
	if len(c.Regions) == 0 {
		bad("Regions is empty")
	}
	seen := map[string]bool{}
	for _, r := range c.Regions {
		if !regionRE.MatchString(r) {
			bad("Regions: %q, want a name like us-east", r)
		}
		if seen[r] {
			bad("Regions: %q listed twice", r)
		}
		seen[r] = true
	}
	if c.Weights != nil {
		if len(c.Weights) != len(c.Regions) {
			bad("Weights has %d values for %d regions", len(c.Weights), len(c.Regions))
		}
		for i, w := range c.Weights {
			if !(w > 0) || math.IsInf(w, 0) {
				bad("Weights[%d] %g, must be finite and > 0", i, w)
			}
		}
	}
	if c.LeaderRev <= 0 {
		bad("LeaderRev %d, must be > 0", c.LeaderRev)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Interval", c.Interval}, {"EarlyGap", c.EarlyGap}, {"ShiftGap", c.ShiftGap}, {"Learning", c.Learning}, {"AckTimeout", c.AckTimeout}, {"MinVersionGap", c.MinVersionGap},
		{"SilentAfter", c.SilentAfter}, {"Stale", c.Stale}, {"KeyTTL", c.KeyTTL}} {
		if d.v <= 0 {
			bad("%s %v, must be > 0", d.name, d.v)
		}
	}
	if c.StepGap < 0 || c.StepGap > c.MinVersionGap {
		bad("StepGap %v, must be in [0, MinVersionGap %v]", c.StepGap, c.MinVersionGap)
	}
	if c.SilentAfter > 0 && c.Stale > 0 && c.Stale < c.SilentAfter {
		bad("Stale %v, must be >= SilentAfter %v", c.Stale, c.SilentAfter)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxEntries", c.MaxEntries}, {"MaxIdentities", c.MaxIdentities}, {"MaxPublished", c.MaxPublished}, {"MaxEnforcers", c.MaxEnforcers}, {"MaxQuotaEntries", c.MaxQuotaEntries}} {
		if n.v <= 0 {
			bad("%s %d, must be > 0", n.name, n.v)
		}
	}
	if c.MaxPublished > c.MaxIdentities && c.MaxIdentities > 0 {
		bad("MaxPublished %d, must be <= MaxIdentities %d", c.MaxPublished, c.MaxIdentities)
	}
	if err := c.Share.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("balancer: CoreConfig.Share: %w", err))
	} else if n := len(c.Regions); n > 0 && c.Share.Floor*float64(n) > 1 {
		// share.AllocateChecked refuses this per identity; a config that can never
		// allocate is refused at start instead.
		bad("Share.Floor %g × %d regions = %g, must be <= 1: the floors cannot fit", c.Share.Floor, n, c.Share.Floor*float64(n))
	}
	if c.Limits == nil {
		bad("Limits is nil")
	}
	return errors.Join(errs...)
}

// weightSplit is the default split from Weights (equal when nil).
func (c *CoreConfig) weightSplit() []float64 {
	n := len(c.Regions)
	out := make([]float64, n)
	sum := 0.0
	for i := range out {
		w := 1.0
		if c.Weights != nil {
			w = c.Weights[i]
		}
		out[i] = w
		sum += w
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}
