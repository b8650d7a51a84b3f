// Package rules holds allot's rule schema, its strict parser and validator, the compiled
// immutable Snapshot that the enforcer matches every request against, and the sources
// (a YAML file, an etcd prefix) that keep a Holder up to date.
//
// A rule says which requests it applies to (Match), what one bucket counts (By), the limits
// of that bucket (Limits), what a request costs (Cost), whether it is enforced or only
// evaluated (Mode) and what happens when the store is down (FailMode). Rules are parsed into
// a Set, validated as a whole and compiled into a Snapshot; a set with any error is rejected
// whole and the previous snapshot keeps serving.
//
// # Matching
//
// Most specific wins, per By-dimension. For each dimension (api_key, ip, org, endpoint,
// global) a request gets at most one enforcing rule and at most one shadow rule: among the
// rules of that dimension and mode that match it and have not expired, the one with the
// highest Match.Specificity (api_key 16, org 8, plan 4, endpoint 2, ip 1), ties going to
// the longer IP prefix, then to the rule written first. So a key's own override beats
// plan+endpoint, which beats plan, which beats the default. A request passes only if every
// enforcing rule returned allows it; shadow rules are evaluated and counted, never enforced.
//
// Compile indexes each dimension's rules by their most specific field (a map per api key,
// org, plan and endpoint, and a short sorted list for IP-only and default rules), so Match
// does a few map lookups and allocates only the identity strings.
//
// # Descriptor rules
//
// A rule with Match.Descriptor matches the entries of an Envoy RLS descriptor (Attrs.Domain
// and Attrs.Entries) the way envoyproxy/ratelimit matches its configuration: in its domain,
// entry by entry in order, each rule entry a key with an exact value, a wildcard value
// ("foo*", "/api/*/action") or any value. Compile files the descriptor rules of a domain in
// a tree, one level per entry, and Match walks it once per request: at each depth the most
// specific edge wins — the exact value, else the first wildcard (in the order written)
// that matches, else the key alone — with no going back, and the rules at the node reached
// by the descriptor's last entry apply (none if the walk stops sooner, or the descriptor
// has more entries than the path). Among that node's rules the named fields decide, as in
// a lane (a key's override beats a plan beats the rest). So a request descriptor gets at
// most one enforcing and one shadow descriptor rule, beside the rules of the named
// dimensions, which see the same request's attributes (the RLS front end maps entries to
// them too). By: descriptor counts every distinct descriptor separately (the domain and
// every entry's key and value make the identity), as envoyproxy/ratelimit counts them; an
// entry matched by a Shared wildcard is counted by the wildcard instead, so all its values
// share one bucket. The domain selects descriptor rules only: the rules of the named
// dimensions apply to a request whatever its domain, as before. See
// docs/envoy-ratelimit.md.
//
// # Errors
//
// Parsing is strict (unknown fields, wrong types and unknown words are errors) and every
// error names the rule, the field and, for YAML, the file and line: see Error. A rules file
// with any error is rejected whole and the source keeps serving the previous snapshot; an
// etcd rule is checked alone and refused alone (see EtcdSource).
//
// # Sources
//
// A Holder serves the snapshot in force. FileSource (a YAML file: reload on SIGHUP and on
// change) and EtcdSource (a watched prefix, optionally over a base set) keep it up to date
// and report errors through a hook and Status.
package rules

import (
	"net/netip"
	"time"
)

// Attrs are what a gateway tells about one request. Empty strings and the zero IP mean
// "unknown": a rule that matches on an unknown attribute does not match. A rule that
// counts by an unknown attribute does not apply (by: org without an org, by: endpoint
// without one), except that no request goes uncounted for want of a key or an address
// (docs/design.md §8): a rule counted by api_key counts a keyless request by its client IP
// (IPv6 per prefix), and a rule counted by api_key or ip counts a request with neither
// key nor IP in one bucket set shared by all such requests (Anonymous).
//
// Domain and Entries are an Envoy RLS descriptor as the gateway sent it, for descriptor
// rules (Match.Descriptor): every entry, in order. Other front ends leave them empty, and
// descriptor rules then do not apply.
type Attrs struct {
	APIKey   string
	Plan     string
	Org      string
	Endpoint string // the route, e.g. "GET /v1/search"
	IP       netip.Addr
	Domain   string
	Entries  []Entry
}

// Entry is one entry of a request's descriptor: a key and its value.
type Entry struct {
	Key, Value string
}

// Mode says whether a rule is enforced or only evaluated. The zero value is ModeEnforce.
type Mode uint8

const (
	// ModeEnforce rules refuse requests over their limits.
	ModeEnforce Mode = iota
	// ModeShadow rules are evaluated and counted ("would have refused"), never enforced.
	ModeShadow
)

// FailMode says what a rule does when its store cannot answer. The zero value is FailOpen.
type FailMode uint8

const (
	// FailOpen rules admit (under degraded local limits) when the store is down.
	FailOpen FailMode = iota
	// FailClosed rules refuse when the store is down (login, OTP, SMS).
	FailClosed
)

// By says what one bucket counts: whose requests share the rule's buckets. The zero value
// is ByAPIKey, the default when a rule does not say.
type By uint8

const (
	// ByAPIKey: one bucket set per API key ("key:<api key>"); a keyless request is
	// counted as ByIP would count it, and one with no IP either as Anonymous.
	ByAPIKey By = iota
	// ByIP: one bucket set per client address; IPv6 per prefix ("ip:<addr>",
	// "ip6:<prefix>/64"); a request with neither IP nor key is counted as Anonymous (a
	// keyed one without an IP is not counted by ip).
	ByIP
	// ByOrg: one bucket set per organisation ("org:<org>").
	ByOrg
	// ByEndpoint: one bucket set per route, shared by all callers ("ep:<endpoint>").
	ByEndpoint
	// ByGlobal: one bucket set for every matching request ("global").
	ByGlobal
	// ByDescriptor: one bucket set per distinct descriptor: its domain and every entry's
	// key and value ("desc:<domain>/<key>=<value>/...", see DescriptorIdentity), as
	// envoyproxy/ratelimit counts. Only for descriptor rules (Match.Descriptor), whose
	// default it is in rule files.
	ByDescriptor

	numBy = iota
)

// Anonymous is the identity of requests with neither an API key nor a client IP, under
// rules counted by api_key or ip: they share one bucket set per rule, so such traffic is
// limited as a whole (errs under for each of them: strangers share one budget) rather than
// unlimited.
const Anonymous = "anonymous"

// CountedBy names the kind of identity that counted a request, from a Matched.Identity:
// "api_key", "ip" (IPv4 address or IPv6 prefix), "org", "endpoint", "global",
// "descriptor" or "anonymous" ("" for anything else). It allocates nothing.
func CountedBy(identity string) string {
	switch {
	case len(identity) > 4 && identity[:4] == "key:":
		return "api_key"
	case len(identity) > 3 && identity[:3] == "ip:", len(identity) > 4 && identity[:4] == "ip6:":
		return "ip"
	case len(identity) > 4 && identity[:4] == "org:":
		return "org"
	case len(identity) > 3 && identity[:3] == "ep:":
		return "endpoint"
	case identity == "global":
		return "global"
	case len(identity) > 5 && identity[:5] == "desc:":
		return "descriptor"
	case identity == Anonymous:
		return "anonymous"
	}
	return ""
}

// Rule is one rule as written (in a YAML file, or as a YAML/JSON value in etcd). It is plain
// data: ParseYAML fills it, Compile validates it. Not safe for concurrent mutation.
type Rule struct {
	// ID names the rule; unique in a set, non-empty. It prefixes bucket names and is what
	// RateLimit-Policy and refusals name.
	ID string
	// Match selects the requests the rule applies to; all set fields must match. An empty
	// Match is a default rule.
	Match Match
	// By says what one bucket counts (default ByAPIKey; rule files default a descriptor
	// rule to ByDescriptor).
	By By
	// Limits are the buckets every matching request takes from, all or nothing. Empty
	// exactly when Unlimited or Refuse.
	Limits []LimitSpec
	// Unlimited rules take nothing: a request they win is not limited in their dimension
	// (envoyproxy/ratelimit's unlimited: true), and the less specific rules there do not
	// apply to it.
	Unlimited bool
	// Refuse rules refuse every request they win, without asking a store: a limit of
	// nothing (envoyproxy/ratelimit's requests_per_unit: 0). Their one compiled limit,
	// named "<rule id>/refuse", holds no tokens.
	Refuse bool
	// Replaces names rules (by id) that do not apply to a request this rule applies to —
	// nor to any other descriptor of the same Envoy RLS request (envoyproxy/ratelimit's
	// replaces).
	Replaces []string
	// Quota marks a quota limit (envoyproxy/ratelimit's quota_mode): a request it refuses
	// is refused, but an Envoy RLS front end answers the request as a whole OVER_LIMIT only
	// when every quota descriptor of it is refused or another, non-quota, descriptor is
	// (grpcapi). The descriptor's own status says OVER_LIMIT either way. Other front ends
	// have one check a request, so there a quota rule refuses as any rule does.
	Quota bool
	// Settle marks a rule whose hits are settlements of costs known only after the
	// response (Envoy's hits sent on stream done, apply_on_stream_done): a check of it
	// takes its hits × cost whatever the buckets hold — never refused, the buckets going
	// into debt of at most one burst (bucket.Limit.Settle) — so the requests after it are
	// refused until the debt has refilled. A check of it with hits_addend 0 (a peek) is
	// refused while the buckets are empty or in debt, as any peek. It needs rate limits.
	Settle bool
	// Cost maps an endpoint to the tokens a request to it takes; absent endpoints cost 1.
	Cost map[string]int64
	// Mode is enforce (default) or shadow.
	Mode Mode
	// FailMode is open (default) or closed.
	FailMode FailMode
	// ExpiresAt, if set, is when the rule stops applying. Mandatory when Match.APIKey is set
	// (per-key overrides must expire).
	ExpiresAt time.Time
	// Reason says why the rule exists (for operators; shown in logs).
	Reason string
	// Shares maps a region to its share of the global limit, in [0, 1], summing to at
	// most 1: the rule's default split. Regions not listed share the rest by weight, and
	// without shares the split is by region weight (see DefaultShare). The balancer may
	// give one identity other shares (pkg/enforcer/overrides).
	Shares map[string]float64
	// Penalty, when set, refuses an identity outright for a while once it has been
	// refused too often (see PenaltySpec). Nil: no penalty.
	Penalty *PenaltySpec

	pos *rulePos // where the rule was written, for error messages; nil when built in Go
}

// Match selects requests. Empty fields match anything; set fields must all match.
type Match struct {
	APIKey   string
	Plan     string
	Org      string
	Endpoint string
	// IP is an address ("192.0.2.7", "2001:db8::1") or a prefix ("10.0.0.0/8",
	// "2001:db8::/48"). IPv4-mapped IPv6 forms are treated as IPv4.
	IP string
	// Domain and Descriptor make a descriptor rule (see the package doc): the Envoy RLS
	// domain it serves (required with Descriptor, not without) and the entries a request's
	// descriptor must have, in order.
	Domain     string
	Descriptor []DescriptorEntry
}

// DescriptorEntry is one entry of a descriptor rule's match.
type DescriptorEntry struct {
	Key string
	// Value is the entry's value: "" matches any value (each counted separately under
	// by: descriptor), a value with '*' is a wildcard ('*' matches any run of
	// characters: "foo*", "/api/*/action"), any other must be equal.
	Value string
	// Shared, only with a wildcard, counts every value the wildcard matches as one
	// (envoyproxy/ratelimit's share_threshold).
	Shared bool
}

// IsZero reports whether m matches every request (a default rule).
func (m *Match) IsZero() bool {
	return m.APIKey == "" && m.Plan == "" && m.Org == "" && m.Endpoint == "" && m.IP == "" &&
		m.Domain == "" && len(m.Descriptor) == 0
}

// LimitSpec is one limit as written: Rate tokens per Per, holding up to Burst tokens; or,
// with Concurrent set, an in-flight limit: at most Concurrent requests of one identity at
// once, each holding its slot until released or for at most Timeout (then Rate, Per and
// Burst are unset). A rule has at most one in-flight limit. With Quota set, a calendar
// quota: at most Quota tokens of one identity from each Period's start in TimeZone to its
// end (calendar.go), all regions together (then Rate, Per, Burst, Concurrent and Timeout
// are unset).
type LimitSpec struct {
	// Name tells the limits of one rule apart ("second", "minute"); unique within the rule.
	Name string
	// Rate is the tokens added per Per; finite and > 0.
	Rate float64
	// Per is the period of Rate ("1s", "1m"); > 0.
	Per time.Duration
	// Burst is the bucket capacity in tokens; 0 means Rate.
	Burst float64
	// Concurrent, when > 0, makes this an in-flight limit: the most requests of one
	// identity held at once, globally (each region holds floor(Concurrent × its share)).
	Concurrent int64
	// Timeout is how long an in-flight request holds its slot without a release: a lost
	// release heals within it. Required with Concurrent.
	Timeout time.Duration
	// Quota, when > 0, makes this a calendar quota: the most tokens one identity may use
	// in one Period, globally (every region counts against the same number).
	Quota int64
	// Period is the quota's calendar period (day, ISO week from Monday, month). Required
	// with Quota.
	Period Period
	// TimeZone is the IANA zone whose midnights bound the periods ("Europe/Paris"); ""
	// means UTC.
	TimeZone string
}

// PenaltySpec is a rule's penalty for abuse as written: an identity this rule refused
// Refusals times within Within is refused by it outright for Block ("refused 1,000 times
// in a minute → refused for 10 minutes"), answered from the enforcers' refusal caches
// without a store call (bucket.Penalty says how refusals are counted).
type PenaltySpec struct {
	Refusals int64
	Within   time.Duration
	Block    time.Duration
}

// IsInflight reports whether l is an in-flight limit.
func (l *LimitSpec) IsInflight() bool { return l.Concurrent != 0 || l.Timeout != 0 }

// IsQuota reports whether l is a calendar quota.
func (l *LimitSpec) IsQuota() bool { return l.Quota != 0 || l.Period != 0 || l.TimeZone != "" }

// Set is a parsed, not yet compiled rule set. Version, when set, names the snapshot it
// compiles into; when empty the snapshot is named by a hash of the content.
type Set struct {
	Version string
	Rules   []Rule

	file string // the file it came from, for error messages
}

// String returns the word the rule files use: "enforce" or "shadow".
func (m Mode) String() string {
	if m == ModeShadow {
		return "shadow"
	}
	if m == ModeEnforce {
		return "enforce"
	}
	return "unknown"
}

// String returns the word the rule files use: "open" or "closed".
func (f FailMode) String() string {
	switch f {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return "unknown"
}

var byNames = [numBy]string{"api_key", "ip", "org", "endpoint", "global", "descriptor"}

// String returns the word the rule files use: "api_key", "ip", "org", "endpoint",
// "global", "descriptor".
func (b By) String() string {
	if b < numBy {
		return byNames[b]
	}
	return "unknown"
}
