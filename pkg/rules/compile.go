package rules

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// CompileOptions say where a set is compiled for. The zero value works: one region (every
// rule gets share 1, or its own shares: entry for Region), IPv6 limited per /64.
type CompileOptions struct {
	// Region names this enforcer's region; it picks each rule's share. "" compiles the
	// global limits (share 1) for tools and the balancer, with or without Regions.
	Region string
	// Regions are every region that enforces the global limits, with their weights
	// (finite, > 0): the default split of a rule that lists no shares: gives region r
	// weight_r / Σ weights. Empty means a single-region deployment: every rule's share is
	// its own shares: entry for Region, else 1. When set, Region must be one of them and
	// every region a rule's shares: names must be one of them.
	Regions map[string]float64
	// IPv6Prefix is the prefix length IPv6 clients are counted by (1-128); 0 means 64.
	IPv6Prefix int
	// Now is the snapshot's Created time; zero means time.Now(). Sources pass their clock's.
	Now time.Time
}

// withDefaults fills defaults and checks the options, naming the bad field and value.
func (o CompileOptions) withDefaults() (CompileOptions, error) {
	if o.IPv6Prefix == 0 {
		o.IPv6Prefix = 64
	}
	switch {
	case o.IPv6Prefix < 1 || o.IPv6Prefix > 128:
		return o, fmt.Errorf("rules: CompileOptions.IPv6Prefix %d, must be in [1, 128]", o.IPv6Prefix)
	case o.Region != "" && !regionRE.MatchString(o.Region):
		return o, fmt.Errorf("rules: CompileOptions.Region %q, want a name like us-east", o.Region)
	}
	for _, r := range sortedKeys(o.Regions) {
		w := o.Regions[r]
		switch {
		case !regionRE.MatchString(r):
			return o, fmt.Errorf("rules: CompileOptions.Regions: region %.60q, want a name like us-east", r)
		case !finite(w) || w <= 0 || w > 1e6:
			return o, fmt.Errorf("rules: CompileOptions.Regions: region %q weight %g, must be finite and in (0, 1e6]", r, w)
		}
	}
	if len(o.Regions) > 0 && o.Region != "" {
		if _, ok := o.Regions[o.Region]; !ok {
			return o, fmt.Errorf("rules: CompileOptions.Region %q is not one of CompileOptions.Regions (%s)", o.Region, strings.Join(sortedKeys(o.Regions), ", "))
		}
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	return o, nil
}

// DefaultShare is the share region gets of a rule with the given shares: under the
// default split, before the balancer says otherwise (docs/design.md §9). With regions listed:
//
//	region named in shares:        shares[region]
//	otherwise:                     (1 − Σ shares) × w_region / Σ_{r not named} w_r
//
// so a rule without shares: splits by weight (equal when the weights are), a rule that
// names some regions leaves the rest of the limit to the others by weight, and the shares
// of all regions sum to at most 1 (exactly 1 unless shares: names every region with a sum
// under 1). Without regions (one region) it is shares[region] if named, else 1. The
// regions and shares are assumed valid (Compile checks them).
func DefaultShare(region string, regions map[string]float64, shares map[string]float64) float64 {
	if s, ok := shares[region]; ok && region != "" {
		return s
	}
	if len(regions) == 0 {
		return 1
	}
	rest, unnamed := 1.0, 0.0
	for r, w := range regions {
		if s, ok := shares[r]; ok {
			rest -= s
		} else {
			unnamed += w
		}
	}
	if rest <= 0 || unnamed <= 0 {
		return 0
	}
	return min(1, rest*regions[region]/unnamed)
}

// Compiled is one rule ready to enforce. Limits are per-second bucket.Limits already scaled
// by this region's default share, named "<rule id>/<limit name>" so that two rules never
// share a bucket of one identity; Global are the same limits unscaled (the global limit,
// share 1), kept so that a per-identity share from the balancer can rescale them
// (LimitsFor). Read-only: it belongs to an immutable Snapshot.
//
// Scaling by a share s multiplies rate and burst by s (LimitsFor has the rounding).
// Nothing is raised past float error, so it errs under: a region whose part of a burst
// is under the rule's largest cost holds none of it (NoTokens) and refuses the rule's
// requests until the balancer moves a token there, and the regions' bursts never sum
// past the global burst.
type Compiled struct {
	ID        string
	Mode      Mode
	FailMode  FailMode
	By        By
	Limits    []bucket.Limit // scaled by Share
	Global    []bucket.Limit // unscaled: the global limits (LimitsFor(1))
	ExpiresAt time.Time      // zero: never expires
	Reason    string
	Policy    string  // "<rule id>": what the IETF RateLimit-Policy field names
	Share     float64 // this region's default share: the one Limits were scaled by
	// Split is the default split over every configured region (CompileOptions.Regions;
	// nil without): what the balancer starts from and returns an identity to.
	Split map[string]float64
	Match Match // as written, for logs and tools
	// Unlimited rules have no limits; Match never returns them (see Rule.Unlimited).
	Unlimited bool
	// Replaces are the ids of the rules this one replaces (see Rule.Replaces).
	Replaces []string
	// Quota is Rule.Quota.
	Quota bool
	// Settle is Rule.Settle.
	Settle bool
	// Inflight is the rule's in-flight limit, nil without one. It is not in Limits or
	// Global: a check acquires a slot of it after the rule's buckets granted.
	Inflight *InflightLimit
	// Penalty is the rule's penalty for abuse (Rule.Penalty) as the stores take it, named
	// by the rule id; nil without one.
	Penalty *bucket.Penalty
	// Calendar are the rule's calendar quotas, none without. They are not in Limits or
	// Global: a check counts against them in memory (pkg/quota), before the rule's buckets.
	Calendar []CalendarQuota

	maxCost float64 // max(1, the largest cost): the burst clamp
}

// InflightLimit is a compiled in-flight limit (LimitSpec.Concurrent).
type InflightLimit struct {
	Name    string        // "<rule id>/<limit name>": the slot set's name, apart from the buckets'
	Global  int64         // the global cap (share 1)
	Cap     int64         // this region's cap at the rule's default share: CapFor(Share)
	Timeout time.Duration // how long a slot is held without a release
}

// CapFor is the region's cap at share (in [0, 1]): floor(Global × share + ε), as bursts
// are rounded (LimitsFor). Rounding down errs under: the regions' caps sum to at most the
// global cap, and a region whose part is under one request holds none (cap 0 refuses
// every acquire until the balancer moves a share there) — up to one request a region of
// the global cap unused.
func (l *InflightLimit) CapFor(share float64) int64 {
	if !(share >= 0) {
		return 0
	}
	return int64(math.Floor(float64(l.Global)*min(share, 1) + burstEpsilon))
}

// Refuses reports whether the rule refuses every request everywhere (Rule.Refuse): its
// global limit holds nothing, so no share of it can.
func (c *Compiled) Refuses() bool { return NoTokens(c.Global) }

// LimitsFor appends to dst the rule's limits scaled by share (in [0, 1]) as described on
// Compiled, and returns the extended slice: LimitsFor(c.Share, nil) equals c.Limits. It
// allocates nothing when dst has room for len(c.Global) limits. For share < 1:
//
//	burst_i = global burst_i × share        (under FractionBelow requests)
//	burst_i = floor(global burst_i × share + 1e-9)   (from FractionBelow requests up)
//	burst_i = 0, rate_i = 0        if that is under the largest cost (by more than 1e-9)
//	rate_i  = global rate_i × share  otherwise
//
// A limit with burst 0 holds no tokens: it is not a valid bucket.Limit, and a caller must
// refuse the rule's requests without asking a store (NoTokens says when). A burst of 2.5
// tokens admits two requests at once and its half token shortens the next refill; a part
// is never rounded up to a request (that let a burst of 1 over five regions admit five).
// The refill time burst_i / rate_i ≤ global burst_i / global rate_i ≤ MaxRefill, so no
// rate is ever raised: the region admits at most its share of the rate as well. Over any
// window T the regions together admit at most Σ burst_r + rate × Σ s_r × T ≤ global
// burst + rate × T when Σ s_r ≤ 1 (a burst within 1e-9 under the largest cost is raised
// to it: 3 × 1/3 of a burst of 1).
func (c *Compiled) LimitsFor(share float64, dst []bucket.Limit) []bucket.Limit {
	for _, g := range c.Global {
		dst = append(dst, ScaleLimit(g, share, c.maxCost))
	}
	return dst
}

// MaxCost is the rule's largest cost per request (at least 1): a region holds none of a
// limit's burst when its part of it is under MaxCost.
func (c *Compiled) MaxCost() float64 { return c.maxCost }

// NoTokens reports whether limits (from LimitsFor) hold no tokens in this region: one of
// them has a burst under one token, so every request of the rule must be refused here
// without a store call.
func NoTokens(limits []bucket.Limit) bool {
	for i := range limits {
		if limits[i].Burst < 1 {
			return true
		}
	}
	return false
}

// FractionBelow is the global burst, in requests of the largest cost, below which a
// region's part of it keeps its fraction (LimitsFor); from it up a part is rounded down
// to whole tokens. Below it one request is over 5% of the burst: a 5/s key offered about
// 1.2/s in each of two regions held 2 and 3 tokens, and the region with two refused its
// Poisson bursts (steady_ratio 0.93; 2.5 each admit what the key's split bucket does).
// From it up a token is inside the balancer's noise band, and whole tokens are the
// hysteresis that keeps a busy key's shares from being republished on noise (the
// balancer hands such shares out in whole requests, and its quantise uses this bound).
const FractionBelow = 20

// burstEpsilon absorbs float error in global burst × share (3 × 1/3 is 0.999…).
const burstEpsilon = 1e-9

// ScaleLimit is one limit of LimitsFor: the global limit g at share for a rule whose
// largest cost is maxCost (Compiled.MaxCost). Exported for tools that ask what another
// burst or share would give (the balancer's admin API).
func ScaleLimit(g bucket.Limit, share, maxCost float64) bucket.Limit {
	if g.Burst == 0 {
		return bucket.Limit{Name: g.Name} // a refuse rule's limit of nothing, at any share
	}
	if share >= 1 {
		// The global limit: Validate keeps burst ≥ the largest cost and the refill time
		// within MaxRefill, so neither clamp bites on a valid rule.
		burst := math.Max(g.Burst, maxCost)
		return bucket.Limit{Name: g.Name, Rate: math.Max(g.Rate, burst/MaxRefill.Seconds()), Burst: burst}
	}
	burst := g.Burst * share
	if g.Burst >= FractionBelow*maxCost {
		burst = math.Floor(burst + burstEpsilon)
	}
	if !(share > 0) || burst+burstEpsilon < maxCost {
		return bucket.Limit{Name: g.Name}
	}
	burst = max(burst, maxCost) // ε: 3 × 1/3 of a burst of 1 is one token
	// burst ≤ global burst × share (+ε), so burst/MaxRefill ≤ global rate × share: the max
	// only keeps float error from making the rate 0 or the refill a hair too long.
	return bucket.Limit{Name: g.Name, Rate: math.Max(g.Rate*share, burst/MaxRefill.Seconds()), Burst: burst}
}

// crule is a compiled rule with its matching data.
type crule struct {
	c      Compiled
	m      Match
	prefix netip.Prefix // valid when m.IP != ""
	cost   map[string]int64
	score  int // see Specificity
	order  int // position in the set
	// desc is the descriptor match with its wildcards split, for Candidates; nil for a
	// rule of the named dimensions.
	desc []descEdge
}

// Specificity is how specific a match is: the sum of api_key 16, org 8, plan 4,
// endpoint 2, ip 1 over the fields it sets. Among the rules of one By-dimension and mode
// that match a request, the one with the highest score wins; ties go to the longer IP
// prefix, then to the rule written first. The weights are powers of two, so the order is
// lexicographic: any rule naming the key beats any that does not (a key's own override
// wins), then org, then plan, then endpoint, then IP; so plan+endpoint (6) beats plan (4)
// beats endpoint alone (2) beats the default (0).
func (m Match) Specificity() int {
	s := 0
	if m.APIKey != "" {
		s += 16
	}
	if m.Org != "" {
		s += 8
	}
	if m.Plan != "" {
		s += 4
	}
	if m.Endpoint != "" {
		s += 2
	}
	if m.IP != "" {
		s++
	}
	return s
}

// Compile validates the whole set (see Set.Validate) and builds an immutable Snapshot for
// opt.Region. On any error it returns no snapshot and an error naming the rule and field
// (errors.Is(err, ErrInvalid) for a bad set). It does not change s.
func Compile(s *Set, opt CompileOptions) (*Snapshot, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := s.validateRegions(opt.Regions); err != nil {
		return nil, err
	}
	snap := &Snapshot{
		version:  s.Version,
		created:  opt.Now,
		ipv6Bits: opt.IPv6Prefix,
		rules:    make([]crule, len(s.Rules)),
		byID:     make(map[string]*Compiled, len(s.Rules)),
	}
	if snap.version == "" {
		snap.version = contentHash(s)
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		cr := &snap.rules[i]
		compileRule(r, i, opt, cr)
		snap.byID[r.ID] = &cr.c
		// Last line of defence: every compiled rule must be a request a store accepts, at
		// its default share unless that holds no tokens (then no store is asked), and at
		// share 1.
		lims := cr.c.Limits
		if NoTokens(lims) {
			lims = cr.c.Global
		}
		if len(lims) == 0 || NoTokens(lims) {
			continue // unlimited or refuse: no store is ever asked
		}
		req := bucket.Request{Identity: "check", Limits: lims, Want: 1}
		if err := req.Validate(); err != nil {
			return nil, ruleErr(r, i, s.file, "limits", "after scaling by share %g: %v", cr.c.Share, err)
		}
	}
	snap.buildLanes()
	if err := snap.buildDescriptors(s); err != nil {
		return nil, err
	}
	return snap, nil
}

func compileRule(r *Rule, order int, opt CompileOptions, cr *crule) {
	share := 1.0
	if opt.Region != "" {
		share = DefaultShare(opt.Region, opt.Regions, r.Shares)
	}
	var split map[string]float64
	if len(opt.Regions) > 0 {
		split = make(map[string]float64, len(opt.Regions))
		for region := range opt.Regions {
			split[region] = DefaultShare(region, opt.Regions, r.Shares)
		}
	}
	maxCost := int64(1)
	for _, c := range r.Cost {
		maxCost = max(maxCost, c)
	}
	*cr = crule{
		c: Compiled{
			ID: r.ID, Mode: r.Mode, FailMode: r.FailMode, By: r.By,
			Global:    make([]bucket.Limit, 0, len(r.Limits)),
			ExpiresAt: r.ExpiresAt, Reason: r.Reason, Policy: r.ID, Share: share, Split: split, Match: cloneMatch(r.Match),
			Unlimited: r.Unlimited, Replaces: slices.Clone(r.Replaces), Quota: r.Quota, Settle: r.Settle,
			maxCost: float64(maxCost),
		},
		m:     normalMatch(r.Match),
		cost:  maps.Clone(r.Cost), // the snapshot must not change if the Set does
		score: r.Match.Specificity(),
		order: order,
	}
	if r.Match.IP != "" {
		cr.prefix, _ = parseIPMatch(r.Match.IP) // Validate checked it
	}
	cr.desc = descEdges(r.Match.Descriptor)
	if r.Refuse {
		cr.c.Global = []bucket.Limit{{Name: r.ID + "/refuse"}} // holds nothing: NoTokens
	}
	if p := r.Penalty; p != nil {
		cr.c.Penalty = &bucket.Penalty{Name: r.ID, Refusals: p.Refusals, Within: p.Within, Block: p.Block}
	}
	for _, l := range r.Limits {
		if l.IsQuota() {
			loc, err := loadZone(l.TimeZone)
			if err != nil { // Validate refused it already
				loc = time.UTC
			}
			cr.c.Calendar = append(cr.c.Calendar, CalendarQuota{Name: r.ID + "/" + l.Name, Quota: l.Quota,
				Period: l.Period, Zone: loc.String(), Loc: loc})
			continue
		}
		if l.IsInflight() {
			in := &InflightLimit{Name: r.ID + "/" + l.Name, Global: l.Concurrent, Timeout: l.Timeout}
			in.Cap = in.CapFor(share)
			cr.c.Inflight = in
			continue
		}
		burst := l.Burst
		if burst == 0 {
			burst = l.Rate
		}
		g := bucket.Limit{Name: r.ID + "/" + l.Name, Rate: l.Rate / l.Per.Seconds(), Burst: burst}
		cr.c.Global = append(cr.c.Global, ScaleLimit(g, 1, cr.c.maxCost)) // Validate keeps share 1 unclamped
	}
	cr.c.Limits = cr.c.LimitsFor(share, make([]bucket.Limit, 0, len(r.Limits)))
}

// contentHash names a set without a version by its content: equal sets get equal names.
func contentHash(s *Set) string {
	b, err := json.Marshal(s.Rules) // maps are encoded in key order: deterministic
	if err != nil {
		// A time json refuses (year > 9999, from Go): print the rules instead, without
		// their positions (pointers) so the hash stays a function of the content.
		rs := slices.Clone(s.Rules)
		for i := range rs {
			rs[i].pos = nil
		}
		b = fmt.Appendf(nil, "%#v", rs) // %#v prints maps in key order
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// lane holds the rules of one By-dimension and one mode, indexed by their most specific
// field (see Specificity): a request looks up its key, then org, plan and endpoint, then
// scans the short rest (IP-only and default rules). Every list is sorted best first, so the
// first rule that matches in the first tier that has one is the winner.
type lane struct {
	byKey, byOrg, byPlan, byEndpoint map[string][]*crule
	rest                             []*crule
}

func better(a, b *crule) int {
	return cmp.Or(
		cmp.Compare(b.score, a.score),
		cmp.Compare(b.prefixBits(), a.prefixBits()),
		cmp.Compare(a.order, b.order),
	)
}

func (r *crule) prefixBits() int {
	if r.m.IP == "" {
		return -1
	}
	return r.prefix.Bits()
}

func (l *lane) add(r *crule) {
	put := func(m *map[string][]*crule, k string) {
		if *m == nil {
			*m = map[string][]*crule{}
		}
		(*m)[k] = append((*m)[k], r)
	}
	switch m := r.m; {
	case m.APIKey != "":
		put(&l.byKey, m.APIKey)
	case m.Org != "":
		put(&l.byOrg, m.Org)
	case m.Plan != "":
		put(&l.byPlan, m.Plan)
	case m.Endpoint != "":
		put(&l.byEndpoint, m.Endpoint)
	default:
		l.rest = append(l.rest, r)
	}
}

func (l *lane) sort() {
	for _, m := range []map[string][]*crule{l.byKey, l.byOrg, l.byPlan, l.byEndpoint} {
		for _, rs := range m {
			slices.SortFunc(rs, better)
		}
	}
	slices.SortFunc(l.rest, better)
}

func (s *Snapshot) buildLanes() {
	for i := range s.rules {
		r := &s.rules[i]
		if len(r.c.Replaces) > 0 {
			s.hasReplaces = true
		}
		if r.desc != nil {
			continue // filed in its domain's descriptor tree (buildDescriptors)
		}
		if r.c.Unlimited {
			s.hasUnlimited = true
		}
		ln := &s.lanes[r.c.By][r.c.Mode]
		if *ln == nil {
			*ln = &lane{}
		}
		(*ln).add(r)
	}
	for by := range s.lanes {
		used := false
		for _, ln := range s.lanes[by] {
			if ln != nil {
				ln.sort()
				used = true
			}
		}
		if used {
			s.dims = append(s.dims, By(by))
		}
	}
}

// normalMatch is m with its endpoint in the form requests' endpoints are matched in.
func normalMatch(m Match) Match {
	m = cloneMatch(m)
	m.Endpoint = NormalizeEndpoint(m.Endpoint)
	return m
}

// cloneMatch is m with its own copy of the descriptor: the snapshot must not change if
// the Set does.
func cloneMatch(m Match) Match {
	m.Descriptor = slices.Clone(m.Descriptor)
	return m
}
