package enforcer

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// ShareStatus is what Explain tells of the set of shares in force, when Config.Shares has
// it (pkg/enforcer/overrides.Holder does).
type ShareStatus interface {
	Applied() (leaderRev int64, version uint64)
	Age(now time.Time) time.Duration
	Stale(now time.Time) bool
}

// Explanation answers "why was I limited?" for one request's attributes: every rule that
// applies, in the order a check takes them, with why it won, its limits (global and this
// region's), the share behind them, the buckets' levels now and the identity's recent
// takes. It is read-only: building it takes no tokens.
type Explanation struct {
	Region       string        `json:"region"`
	At           time.Time     `json:"at"`
	RulesVersion string        `json:"rules_version"`
	Rules        []RuleExplain `json:"rules"`
	// Admin is false for a customer's view: only the caller's own api key's buckets are
	// shown in full (see Redact).
	Admin bool `json:"admin"`
}

// RuleExplain is one rule that applies to the request.
type RuleExplain struct {
	Rule     string `json:"rule"`
	Mode     string `json:"mode"`
	By       string `json:"by"`
	Identity string `json:"identity"`
	Cost     int64  `json:"cost"`
	// Specificity is the rule's match score (rules.Match.Specificity); Matched the match
	// fields it names, with the request's values; Beat the other rules of its dimension
	// and mode that fit the request but lost (less specific or written later), and
	// Expired the ones that would have but have expired.
	Specificity int               `json:"specificity"`
	Matched     map[string]string `json:"matched"`
	Why         string            `json:"why"`
	Beat        []Loser           `json:"beat,omitempty"`
	Expired     []string          `json:"expired,omitempty"`
	ExpiresAt   time.Time         `json:"expires_at,omitzero"`
	Reason      string            `json:"reason,omitempty"`

	Share  ShareExplain   `json:"share"`
	Limits []LimitExplain `json:"limits"`
	// Penalty is the rule's penalty for abuse and where the identity stands with it;
	// absent for a rule without one.
	Penalty *PenaltyExplain `json:"penalty,omitempty"`
	// Quotas are the rule's calendar quotas: the identity's use in the current period,
	// what is left and when the period resets (this enforcer's count: the counter's last
	// total + its own counts not yet sent).
	Quotas []QuotaUsage     `json:"quotas,omitempty"`
	Recent []RecentDecision `json:"recent,omitempty"`
	// Redacted is true in a customer's view for a bucket that is not the caller's own
	// (ip, org, endpoint, global): its identity, levels, share and recent takes are left
	// out; the rule and its limits are shown.
	Redacted bool `json:"redacted,omitempty"`
}

// Loser is a rule that fit the request but lost to the winner.
type Loser struct {
	Rule        string `json:"rule"`
	Specificity int    `json:"specificity"`
}

// ShareExplain is the part of the rule's global limits this region enforces for the
// identity.
type ShareExplain struct {
	Value float64 `json:"value"`
	// Source is "balancer" (a per-identity share from the balancer), "default" (the
	// rule's default split: no share published for the identity, or one equal to it) or
	// "stale-default" (the set in force is older than its staleness period).
	Source       string             `json:"source"`
	Default      float64            `json:"default"`
	DefaultSplit map[string]float64 `json:"default_split,omitempty"`
	// LeaderRev and Version name the set of shares in force; AgeSeconds is how long ago
	// the balancer last confirmed it (absent without shares).
	LeaderRev  int64   `json:"leader_rev,omitempty"`
	Version    uint64  `json:"version,omitempty"`
	AgeSeconds float64 `json:"age_seconds,omitempty"`
}

// LimitExplain is one limit: global (the rule as written, per second) and this region's
// (× share), and the bucket's level now.
type LimitExplain struct {
	Name        string  `json:"name"`
	GlobalRate  float64 `json:"global_rate"`
	GlobalBurst float64 `json:"global_burst"`
	Rate        float64 `json:"rate"`
	Burst       float64 `json:"burst"`
	// Level is the tokens the bucket holds now (Burst when full or never used); absent
	// when it could not be read (LevelError says why) or is redacted. On Redis it is the
	// shared bucket's: tokens leased to enforcers' local batches are already out of it.
	// Negative while the bucket is in debt after a settlement (settle.go): checks are
	// refused until it has refilled past zero.
	Level      *float64 `json:"level,omitempty"`
	LevelError string   `json:"level_error,omitempty"`
}

// PenaltyExplain is a rule's penalty (rules.Rule.Penalty) and the identity's state of it
// in the store. The count is the store's: refusals enforcers answered from their refusal
// caches and have not handed over yet (at most one refusal-cache interval's each) are not
// in it.
type PenaltyExplain struct {
	Refusals      int64   `json:"refusals"`
	WithinSeconds float64 `json:"within_seconds"`
	BlockSeconds  float64 `json:"block_seconds"`
	// Counted is the refusals counted in the current window (the count that blocked the
	// identity, while Blocked).
	Counted int64 `json:"counted"`
	// Blocked says the identity is refused outright by this rule until Until (UTC, the
	// store's clock).
	Blocked bool      `json:"blocked"`
	Until   time.Time `json:"until,omitzero"`
	// Error says why the state could not be read (then Counted and Blocked are unknown).
	Error string `json:"error,omitempty"`
}

// Explain explains req (see Explanation). admin false gives the customer's view: only
// buckets counted by the request's own api key (by: api_key) are shown in full. It reads
// the store (one Peek per rule) and scans the rule set: it is for operators and customers
// asking, never for the check path.
func (e *Enforcer) Explain(ctx context.Context, req *Request, admin bool) (Explanation, error) {
	if err := e.Validate(req); err != nil {
		return Explanation{}, err
	}
	now := e.clock.Now()
	x := Explanation{Region: e.cfg.Region, At: now.UTC(), Admin: admin, Rules: []RuleExplain{}}
	snap := e.cfg.Rules.Current()
	if snap == nil {
		return x, nil
	}
	x.RulesVersion = snap.Version()
	matched := snap.Match(&req.Attrs, now, nil)
	if snap.HasReplaces() {
		matched = rules.DropReplaced(matched, req.Replaced)
	}
	orderTakes(matched)
	cands := snap.Candidates(&req.Attrs, now)
	peek := e.cfg.Peek
	if peek == nil {
		peek, _ = e.cfg.Store.(bucket.Peeker)
	}
	hits := max(req.Hits, 1)
	for i := range matched {
		m := &matched[i]
		c := m.Rule
		re := RuleExplain{Rule: c.ID, Mode: c.Mode.String(), By: c.By.String(), Identity: m.Identity, Cost: m.Cost * hits,
			Specificity: c.Match.Specificity(), Matched: matchedFields(c.Match, &req.Attrs), ExpiresAt: c.ExpiresAt, Reason: c.Reason}
		for _, cd := range cands {
			if cd.Rule == c || cd.Rule.By != c.By || cd.Rule.Mode != c.Mode {
				continue
			}
			if cd.Expired {
				re.Expired = append(re.Expired, cd.Rule.ID)
			} else {
				re.Beat = append(re.Beat, Loser{Rule: cd.Rule.ID, Specificity: cd.Specificity})
			}
		}
		re.Why = why(&re)
		var sc scratch
		lim := e.limitsOf(&sc, m, now)
		re.Share = e.shareExplain(m, lim.share, now)
		for j, g := range c.Global {
			re.Limits = append(re.Limits, LimitExplain{Name: g.Name, GlobalRate: g.Rate, GlobalBurst: g.Burst, Rate: lim.l[j].Rate, Burst: lim.l[j].Burst})
		}
		if !admin && c.By != rules.ByAPIKey {
			re.Identity, re.Redacted, re.Share = "", true, ShareExplain{}
			x.Rules = append(x.Rules, re)
			continue
		}
		if c.Refuses() {
			for j := range re.Limits {
				re.Limits[j].LevelError = "the rule refuses every request (refuse: true); no bucket is kept"
			}
		} else if rules.NoTokens(lim.l) {
			for j := range re.Limits {
				re.Limits[j].LevelError = "this region holds none of the burst: its share is under one request's cost, so it refuses until the balancer moves a token here"
			}
		} else if peek == nil {
			for j := range re.Limits {
				re.Limits[j].LevelError = "the store cannot be read without taking"
			}
		} else if levels, err := peek.Peek(ctx, m.Identity, lim.l, nil); err != nil {
			for j := range re.Limits {
				re.Limits[j].LevelError = err.Error()
			}
		} else {
			for j := range re.Limits {
				v := levels[j]
				re.Limits[j].Level = &v
			}
		}
		if p := c.Penalty; p != nil {
			re.Penalty = e.penaltyExplain(ctx, peek, m.Identity, p)
		}
		if len(c.Calendar) > 0 {
			re.Quotas = e.quotaUsage(ctx, m, now)
		}
		for _, d := range e.recent.of(m.Identity) {
			if d.Rule == c.ID {
				re.Recent = append(re.Recent, d)
			}
		}
		x.Rules = append(x.Rules, re)
	}
	return x, nil
}

// penaltyExplain reads identity's state of penalty p from the store that explain reads
// (Config.Peek, else the Store), when it can.
func (e *Enforcer) penaltyExplain(ctx context.Context, peek bucket.Peeker, identity string, p *bucket.Penalty) *PenaltyExplain {
	x := &PenaltyExplain{Refusals: p.Refusals, WithinSeconds: p.Within.Seconds(), BlockSeconds: p.Block.Seconds()}
	pp, ok := peek.(bucket.PenaltyPeeker)
	if !ok {
		x.Error = "the store cannot read a penalty without taking"
		return x
	}
	st, now, err := pp.PeekPenalty(ctx, identity, p)
	if err != nil {
		x.Error = err.Error()
		return x
	}
	x.Counted = st.Count
	if st.Blocked(now) {
		x.Blocked, x.Until = true, time.UnixMicro(st.Until).UTC()
	}
	return x
}

func (e *Enforcer) shareExplain(m *rules.Matched, share float64, now time.Time) ShareExplain {
	s := ShareExplain{Value: share, Source: "default", Default: m.Rule.Share, DefaultSplit: m.Rule.Split}
	if share != m.Rule.Share {
		s.Source = "balancer"
	}
	if st, ok := e.cfg.Shares.(ShareStatus); ok {
		s.LeaderRev, s.Version = st.Applied()
		s.AgeSeconds = st.Age(now).Seconds()
		if st.Stale(now) && s.Source == "default" {
			s.Source = "stale-default"
		}
	}
	return s
}

// matchedFields names what a rule's match tested, with the request's values.
func matchedFields(m rules.Match, a *rules.Attrs) map[string]string {
	out := map[string]string{}
	if m.APIKey != "" {
		out["api_key"] = a.APIKey
	}
	if m.Org != "" {
		out["org"] = a.Org
	}
	if m.Plan != "" {
		out["plan"] = a.Plan
	}
	if m.Endpoint != "" {
		out["endpoint"] = a.Endpoint
	}
	if m.IP != "" {
		out["ip"] = a.IP.String() + " in " + m.IP
	}
	if len(m.Descriptor) > 0 {
		out["domain"] = a.Domain
		out["descriptor"] = rules.DescriptorIdentity(a.Domain, a.Entries, nil)
	}
	return out
}

func why(re *RuleExplain) string {
	if len(re.Beat) == 0 {
		if len(re.Matched) == 0 {
			return "a default rule (matches every request); no other " + re.Mode + " rule by " + re.By + " fits"
		}
		return "the only " + re.Mode + " rule by " + re.By + " that fits"
	}
	b := re.Beat[0]
	s := fmt.Sprintf("beats %s", b.Rule)
	if n := len(re.Beat); n > 1 {
		s += fmt.Sprintf(" and %d more", n-1)
	}
	if b.Specificity < re.Specificity {
		return s + fmt.Sprintf(": specificity %d over %d (api_key 16, org 8, plan 4, endpoint 2, ip 1)", re.Specificity, b.Specificity)
	}
	if _, ok := re.Matched["descriptor"]; ok {
		return s + ": its descriptor path is the one the request's entries take (at each depth an exact value before a wildcard before any value), or same specificity and written first"
	}
	return s + ": same specificity, a longer IP prefix or written first"
}
