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
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// CompileOptions say where a set is compiled for. The zero value works: no region (every
// rule gets DefaultShare), share 1, IPv6 limited per /64.
type CompileOptions struct {
	// Region names this enforcer's region; it picks each rule's share. "" uses DefaultShare.
	Region string
	// DefaultShare is the share of a rule that lists no share for Region, in [0, 1];
	// 0 means 1 (a single region enforces the whole global limit).
	DefaultShare float64
	// IPv6Prefix is the prefix length IPv6 clients are counted by (1-128); 0 means 64.
	IPv6Prefix int
	// Now is the snapshot's Created time; zero means time.Now(). Sources pass their clock's.
	Now time.Time
}

// withDefaults fills defaults and checks the options, naming the bad field and value.
func (o CompileOptions) withDefaults() (CompileOptions, error) {
	if o.DefaultShare == 0 {
		o.DefaultShare = 1
	}
	if o.IPv6Prefix == 0 {
		o.IPv6Prefix = 64
	}
	switch {
	case !finite(o.DefaultShare) || o.DefaultShare < 0 || o.DefaultShare > 1:
		return o, fmt.Errorf("rules: CompileOptions.DefaultShare %g, must be in [0, 1]", o.DefaultShare)
	case o.IPv6Prefix < 1 || o.IPv6Prefix > 128:
		return o, fmt.Errorf("rules: CompileOptions.IPv6Prefix %d, must be in [1, 128]", o.IPv6Prefix)
	case o.Region != "" && !regionRE.MatchString(o.Region):
		return o, fmt.Errorf("rules: CompileOptions.Region %q, want a name like us-east", o.Region)
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	return o, nil
}

// Compiled is one rule ready to enforce. Limits are per-second bucket.Limits already scaled
// by this region's share, named "<rule id>/<limit name>" so that two rules never share a
// bucket of one identity. Read-only: it belongs to an immutable Snapshot.
//
// Scaling by a share s multiplies rate and burst by s. Two clamps keep every Limit valid
// for a store, and both err over (more admitted than rate × s): burst is raised to at least
// max(1, the rule's largest cost) so every request can pass once, and a rate so small that
// the bucket would take longer than MaxRefill to fill is raised to burst / MaxRefill. They
// only bite for shares near 0.
type Compiled struct {
	ID        string
	Mode      Mode
	FailMode  FailMode
	By        By
	Limits    []bucket.Limit
	ExpiresAt time.Time // zero: never expires
	Reason    string
	Policy    string  // "<rule id>": what the IETF RateLimit-Policy field names
	Share     float64 // the share Limits were scaled by
	Match     Match   // as written, for logs and tools
}

// crule is a compiled rule with its matching data.
type crule struct {
	c      Compiled
	m      Match
	prefix netip.Prefix // valid when m.IP != ""
	cost   map[string]int64
	score  int // see Specificity
	order  int // position in the set
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
		// Last line of defence: every compiled rule must be a request a store accepts.
		req := bucket.Request{Identity: "check", Limits: cr.c.Limits, Want: 1}
		if err := req.Validate(); err != nil {
			return nil, ruleErr(r, i, s.file, "limits", "after scaling by share %g: %v", cr.c.Share, err)
		}
	}
	snap.buildLanes()
	return snap, nil
}

func compileRule(r *Rule, order int, opt CompileOptions, cr *crule) {
	share, ok := r.Shares[opt.Region]
	if !ok || opt.Region == "" {
		share = opt.DefaultShare
	}
	maxCost := int64(1)
	for _, c := range r.Cost {
		maxCost = max(maxCost, c)
	}
	*cr = crule{
		c: Compiled{
			ID: r.ID, Mode: r.Mode, FailMode: r.FailMode, By: r.By,
			Limits:    make([]bucket.Limit, len(r.Limits)),
			ExpiresAt: r.ExpiresAt, Reason: r.Reason, Policy: r.ID, Share: share, Match: r.Match,
		},
		m:     r.Match,
		cost:  maps.Clone(r.Cost), // the snapshot must not change if the Set does
		score: r.Match.Specificity(),
		order: order,
	}
	if r.Match.IP != "" {
		cr.prefix, _ = parseIPMatch(r.Match.IP) // Validate checked it
	}
	for j, l := range r.Limits {
		burst := l.Burst
		if burst == 0 {
			burst = l.Rate
		}
		rate := l.Rate / l.Per.Seconds() * share
		burst = math.Max(burst*share, float64(maxCost))
		rate = math.Max(rate, burst/MaxRefill.Seconds())
		cr.c.Limits[j] = bucket.Limit{Name: r.ID + "/" + l.Name, Rate: rate, Burst: burst}
	}
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
