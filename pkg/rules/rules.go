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
type Attrs struct {
	APIKey   string
	Plan     string
	Org      string
	Endpoint string // the route, e.g. "GET /v1/search"
	IP       netip.Addr
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

	numBy = iota
)

// Anonymous is the identity of requests with neither an API key nor a client IP, under
// rules counted by api_key or ip: they share one bucket set per rule, so such traffic is
// limited as a whole (errs under for each of them: strangers share one budget) rather than
// unlimited.
const Anonymous = "anonymous"

// CountedBy names the kind of identity that counted a request, from a Matched.Identity:
// "api_key", "ip" (IPv4 address or IPv6 prefix), "org", "endpoint", "global" or
// "anonymous" ("" for anything else). It allocates nothing.
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
	// By says what one bucket counts (default ByAPIKey).
	By By
	// Limits are the buckets every matching request takes from, all or nothing.
	Limits []LimitSpec
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
}

// LimitSpec is one limit as written: Rate tokens per Per, holding up to Burst tokens.
type LimitSpec struct {
	// Name tells the limits of one rule apart ("second", "minute"); unique within the rule.
	Name string
	// Rate is the tokens added per Per; finite and > 0.
	Rate float64
	// Per is the period of Rate ("1s", "1m"); > 0.
	Per time.Duration
	// Burst is the bucket capacity in tokens; 0 means Rate.
	Burst float64
}

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

var byNames = [numBy]string{"api_key", "ip", "org", "endpoint", "global"}

// String returns the word the rule files use: "api_key", "ip", "org", "endpoint", "global".
func (b By) String() string {
	if b < numBy {
		return byNames[b]
	}
	return "unknown"
}
