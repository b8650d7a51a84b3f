package rules

import (
	"net/netip"
	"sync/atomic"
	"time"
)

// Matched is one rule that applies to a request: the rule, the identity whose buckets it
// takes from ("key:<api key>", "ip:<addr>", "ip6:<prefix>/64", "org:<org>",
// "ep:<endpoint>", "global") and what this request costs under it (>= 1).
type Matched struct {
	Rule     *Compiled
	Identity string
	Cost     int64
}

// Snapshot is a compiled rule set. It is immutable once Compile returns it and safe for
// concurrent use; matching takes no lock. The zero value is an empty set that matches
// nothing (Version "").
type Snapshot struct {
	version  string
	created  time.Time
	ipv6Bits int
	rules    []crule
	byID     map[string]*Compiled
	lanes    [numBy][2]*lane // [by][mode]; nil when no rule of that kind
	dims     []By            // the Bys that have a lane, in order
	// domains holds the descriptor rules, a tree per domain (descriptor.go); nil when
	// there are none.
	domains      map[string]*dnode
	hasReplaces  bool // some rule replaces others
	hasUnlimited bool // some rule of the named dimensions is unlimited
	// interns caches the identity strings Match builds (intern.go); nil until the first
	// Match that builds one.
	interns atomic.Pointer[identities]
}

// Version names the rule set: Set.Version, or "sha256:<16 hex>" of the content.
func (s *Snapshot) Version() string { return s.version }

// Created is when the snapshot was compiled (CompileOptions.Now).
func (s *Snapshot) Created() time.Time { return s.created }

// Len is the number of rules, expired ones included.
func (s *Snapshot) Len() int { return len(s.rules) }

// Rule returns the rule with the given id, or nil.
func (s *Snapshot) Rule(id string) *Compiled { return s.byID[id] }

// Rules returns every rule in set order. The caller must not modify them.
func (s *Snapshot) Rules() []*Compiled {
	out := make([]*Compiled, len(s.rules))
	for i := range s.rules {
		out[i] = &s.rules[i].c
	}
	return out
}

// NextExpiry returns the earliest expires_at after now, or the zero time if no rule will
// expire; a source or metric can use it to say when the effective rules change next.
func (s *Snapshot) NextExpiry(now time.Time) time.Time {
	var next time.Time
	for i := range s.rules {
		e := s.rules[i].c.ExpiresAt
		if e.After(now) && (next.IsZero() || e.Before(next)) {
			next = e
		}
	}
	return next
}

// Match appends to dst the rules that apply to a at now and returns the extended slice:
// for each By-dimension, the most specific enforcing rule that matches (see Specificity),
// and the most specific shadow rule that matches (evaluated, never enforced; Rule.Mode
// says which). A rule whose ExpiresAt is not after now is skipped, so an override stops
// applying on time without a new push, and the next most specific rule takes over.
//
// A dimension whose identity is unknown (by: org without an org, by: endpoint without one,
// by: ip without an IP on a keyed request) yields nothing; by: api_key without a key
// counts the client IP instead, and by: api_key or ip with neither key nor valid IP counts
// Anonymous (see Attrs). IPv4-mapped IPv6 addresses are
// treated as IPv4; IPv6 clients are counted per prefix (CompileOptions.IPv6Prefix).
//
// Match allocates only the identity strings it has not built recently (one per dimension
// that matched, none for "global"; a bounded cache keeps the others), and nothing else if
// dst has room. The checks of one identity get one string, which the tables keyed by it
// compare by pointer. It does not check identity length against
// bucket.MaxIdentityLen: callers bound their inputs.
func (s *Snapshot) Match(a *Attrs, now time.Time, dst []Matched) []Matched {
	if s.domains != nil && len(a.Entries) > 0 {
		dst = s.matchDescriptor(a, now, dst)
	}
	if len(s.dims) == 0 {
		return dst
	}
	ip := a.IP.Unmap().WithZone("")
	for _, by := range s.dims {
		if !known(by, a, ip) {
			continue
		}
		var win [2]*crule
		for mode, ln := range s.lanes[by] {
			if ln != nil {
				r := ln.match(a, ip, now)
				if s.hasUnlimited { // a flag at hand, not a load from the rule for every set
					r = limited(r)
				}
				win[mode] = r
			}
		}
		if win[0] == nil && win[1] == nil {
			continue
		}
		id, ok := s.identity(by, a, ip)
		if !ok {
			continue
		}
		for _, r := range win {
			if r != nil {
				dst = append(dst, Matched{Rule: &r.c, Identity: id, Cost: r.costOf(a.Endpoint)})
			}
		}
	}
	return dst
}

// limited is r unless it is unlimited: an unlimited winner takes nothing, and the less
// specific rules it beat do not apply either.
func limited(r *crule) *crule {
	if r != nil && r.c.Unlimited {
		return nil
	}
	return r
}

// known says whether a request can be counted under dimension by: it carries the
// attribute by counts, or (api_key, ip) a fallback for it.
func known(by By, a *Attrs, ip netip.Addr) bool {
	switch by {
	case ByOrg:
		return a.Org != ""
	case ByEndpoint:
		return a.Endpoint != ""
	case ByDescriptor:
		return len(a.Entries) > 0
	}
	return true
}

// identity names the buckets a request takes from under dimension by.
func (s *Snapshot) identity(by By, a *Attrs, ip netip.Addr) (string, bool) {
	switch by {
	case ByAPIKey:
		if a.APIKey == "" {
			return s.identity(ByIP, a, ip) // keyless: counted by its client
		}
		return s.internTable().text(ByAPIKey, "key:", a.APIKey), true
	case ByOrg:
		if a.Org == "" {
			return "", false
		}
		return s.internTable().text(ByOrg, "org:", a.Org), true
	case ByEndpoint:
		if a.Endpoint == "" {
			return "", false
		}
		return s.internTable().text(ByEndpoint, "ep:", a.Endpoint), true
	case ByGlobal:
		return "global", true
	case ByDescriptor:
		return DescriptorIdentity(a.Domain, a.Entries, nil), len(a.Entries) > 0
	case ByIP:
		if !ip.IsValid() {
			// A keyed request without an address is counted by its key elsewhere.
			return Anonymous, a.APIKey == ""
		}
		if ip.Is4() {
			return s.internTable().addr(ip, formatIP), true
		}
		p, _ := ip.Prefix(s.ipv6Bits) // bits validated at compile
		return s.internTable().addr(p.Addr(), s.formatIP6), true
	}
	return "", false
}

// formatIP is the identity of the IPv4 client ip.
func formatIP(ip netip.Addr) string {
	var buf [32]byte
	return string(ip.AppendTo(append(buf[:0], "ip:"...)))
}

// formatIP6 is the identity of the IPv6 prefix whose address is ip.
func (s *Snapshot) formatIP6(ip netip.Addr) string {
	var buf [64]byte
	return string(netip.PrefixFrom(ip, s.ipv6Bits).AppendTo(append(buf[:0], "ip6:"...)))
}

func (l *lane) match(a *Attrs, ip netip.Addr, now time.Time) *crule {
	if a.APIKey != "" && l.byKey != nil {
		if r := first(l.byKey[a.APIKey], a, ip, now); r != nil {
			return r
		}
	}
	if a.Org != "" && l.byOrg != nil {
		if r := first(l.byOrg[a.Org], a, ip, now); r != nil {
			return r
		}
	}
	if a.Plan != "" && l.byPlan != nil {
		if r := first(l.byPlan[a.Plan], a, ip, now); r != nil {
			return r
		}
	}
	if a.Endpoint != "" && l.byEndpoint != nil {
		if r := first(l.byEndpoint[a.Endpoint], a, ip, now); r != nil {
			return r
		}
	}
	return first(l.rest, a, ip, now)
}

// first returns the first rule of rs (sorted best first) that matches and has not expired.
func first(rs []*crule, a *Attrs, ip netip.Addr, now time.Time) *crule {
	for _, r := range rs {
		if r.matches(a, ip, now) {
			return r
		}
	}
	return nil
}

func (r *crule) matches(a *Attrs, ip netip.Addr, now time.Time) bool {
	m := &r.m
	switch {
	case !r.c.ExpiresAt.IsZero() && !now.Before(r.c.ExpiresAt):
		return false
	case m.APIKey != "" && m.APIKey != a.APIKey,
		m.Org != "" && m.Org != a.Org,
		m.Plan != "" && m.Plan != a.Plan,
		m.Endpoint != "" && m.Endpoint != a.Endpoint:
		return false
	case m.IP != "" && !r.prefix.Contains(ip): // Contains is false for an invalid ip
		return false
	}
	return true
}

func (r *crule) costOf(endpoint string) int64 {
	if len(r.cost) == 0 {
		return 1
	}
	if c, ok := r.cost[endpoint]; ok {
		return c
	}
	return 1
}
