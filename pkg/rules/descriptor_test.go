package rules

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// descriptorSet is envoyproxy/ratelimit's README examples written as descriptor rules,
// with a few of allot's named fields beside them.
const descriptorSet = `
rules:
  # messaging: 5 marketing messages a day per number, 100 of any type.
  - id: marketing
    match:
      domain: messaging
      descriptor: [{key: message_type, value: marketing}, {key: to_number}]
    limits: [{name: day, rate: 5, per: 24h}]
  - id: any-number
    match: {domain: messaging, descriptor: [{key: to_number}]}
    limits: [{name: day, rate: 100, per: 24h}]
  # edge: 10 a second per address, none from 50.0.0.5, no limit for 10.9.9.9.
  - id: per-address
    match: {domain: edge, descriptor: [{key: remote_address}]}
    limits: [{name: second, rate: 10, per: 1s}]
  - id: blocked
    match: {domain: edge, descriptor: [{key: remote_address, value: 50.0.0.5}]}
    refuse: true
  - id: trusted
    match: {domain: edge, descriptor: [{key: remote_address, value: 10.9.9.9}]}
    unlimited: true
  # wildcards: the first written that matches wins; a shared one counts as one.
  - id: files
    match: {domain: web, descriptor: [{key: path, value: "/files/*", shared: true}]}
    limits: [{name: minute, rate: 60, per: 1m}]
  - id: api-action
    match: {domain: web, descriptor: [{key: path, value: "/api/*/action"}]}
    limits: [{name: minute, rate: 20, per: 1m}]
  - id: api-any
    match: {domain: web, descriptor: [{key: path, value: "/api/*"}]}
    limits: [{name: minute, rate: 30, per: 1m}]
  - id: path-exact
    match: {domain: web, descriptor: [{key: path, value: /api/v1/action}]}
    limits: [{name: minute, rate: 40, per: 1m}]
  - id: path-any
    match: {domain: web, descriptor: [{key: path}]}
    limits: [{name: minute, rate: 50, per: 1m}]
  # named fields at one node: the plan's rule beats the plain one; a key's override
  # beats both until it expires; a shadow rule beside; one counted by ip.
  - id: tenant
    match: {domain: saas, descriptor: [{key: tenant}, {key: user}]}
    limits: [{name: second, rate: 5, per: 1s}]
  - id: tenant-pro
    match: {domain: saas, plan: pro, descriptor: [{key: tenant}, {key: user}]}
    limits: [{name: second, rate: 50, per: 1s}]
  - id: tenant-k1
    match: {domain: saas, api_key: k1, descriptor: [{key: tenant}, {key: user}]}
    expires_at: 2024-06-01T13:00:00Z
    limits: [{name: second, rate: 500, per: 1s}]
  - id: tenant-shadow
    mode: shadow
    match: {domain: saas, descriptor: [{key: tenant}, {key: user}]}
    limits: [{name: second, rate: 1, per: 1s}]
  - id: tenant-ip
    by: ip
    match: {domain: saas, ip: 10.0.0.0/8, descriptor: [{key: tenant, value: acme}]}
    limits: [{name: second, rate: 7, per: 1s}]
`

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

func TestDescriptorMatch(t *testing.T) {
	snap := mustCompile(t, descriptorSet, CompileOptions{})
	for _, tc := range []struct {
		name string
		a    Attrs
		want string
	}{
		// Nesting: the exact value leads to the nested rule; each number is its own bucket,
		// and so is the message type's value (the whole descriptor is the identity).
		{"nested exact then any", Attrs{Domain: "messaging", Entries: entries("message_type", "marketing", "to_number", "2061111111")},
			"marketing@desc:messaging/message_type=marketing/to_number=2061111111×1"},
		{"another number", Attrs{Domain: "messaging", Entries: entries("message_type", "marketing", "to_number", "2062222222")},
			"marketing@desc:messaging/message_type=marketing/to_number=2062222222×1"},
		{"key alone", Attrs{Domain: "messaging", Entries: entries("to_number", "2061111111")},
			"any-number@desc:messaging/to_number=2061111111×1"},
		// No going back: message_type=marketing has no rule of its own; a walk that stops
		// there, or has entries left past a leaf, matches nothing.
		{"shorter than the path", Attrs{Domain: "messaging", Entries: entries("message_type", "marketing")}, ""},
		{"longer than the path", Attrs{Domain: "messaging", Entries: entries("to_number", "1", "extra", "x")}, ""},
		{"other value, no key-only edge", Attrs{Domain: "messaging", Entries: entries("message_type", "alert", "to_number", "1")}, ""},
		{"other domain", Attrs{Domain: "edge", Entries: entries("to_number", "1")}, ""},
		{"no domain", Attrs{Entries: entries("to_number", "1")}, ""},
		// Exact before key alone; unlimited and refuse win at their node like any rule.
		{"per address", Attrs{Domain: "edge", Entries: entries("remote_address", "192.0.2.1")},
			"per-address@desc:edge/remote_address=192.0.2.1×1"},
		{"blocked", Attrs{Domain: "edge", Entries: entries("remote_address", "50.0.0.5")},
			"blocked@desc:edge/remote_address=50.0.0.5×1"},
		{"unlimited beats the key alone", Attrs{Domain: "edge", Entries: entries("remote_address", "10.9.9.9")}, ""},
		// Wildcards: exact, then the first written wildcard that matches, then any value.
		{"exact before wildcard", Attrs{Domain: "web", Entries: entries("path", "/api/v1/action")},
			"path-exact@desc:web/path=%2Fapi%2Fv1%2Faction×1"},
		{"middle wildcard", Attrs{Domain: "web", Entries: entries("path", "/api/v2/action")},
			"api-action@desc:web/path=%2Fapi%2Fv2%2Faction×1"},
		{"trailing wildcard", Attrs{Domain: "web", Entries: entries("path", "/api/v2/other")},
			"api-any@desc:web/path=%2Fapi%2Fv2%2Fother×1"},
		{"shared wildcard counts as one", Attrs{Domain: "web", Entries: entries("path", "/files/a.txt")},
			"files@desc:web/path~%2Ffiles%2F*×1"},
		{"shared wildcard, another value", Attrs{Domain: "web", Entries: entries("path", "/files/b/c")},
			"files@desc:web/path~%2Ffiles%2F*×1"},
		{"wildcard needs its prefix", Attrs{Domain: "web", Entries: entries("path", "/apis")},
			"path-any@desc:web/path=%2Fapis×1"},
		// Named fields decide among one node's rules; the shadow rule rides along.
		{"plain", Attrs{Domain: "saas", Entries: entries("tenant", "globex", "user", "u1")},
			"tenant@desc:saas/tenant=globex/user=u1×1 tenant-shadow@desc:saas/tenant=globex/user=u1×1"},
		{"plan", Attrs{Domain: "saas", Plan: "pro", Entries: entries("tenant", "globex", "user", "u1")},
			"tenant-pro@desc:saas/tenant=globex/user=u1×1 tenant-shadow@desc:saas/tenant=globex/user=u1×1"},
		{"key override", Attrs{Domain: "saas", APIKey: "k1", Plan: "pro", Entries: entries("tenant", "globex", "user", "u1")},
			"tenant-k1@desc:saas/tenant=globex/user=u1×1 tenant-shadow@desc:saas/tenant=globex/user=u1×1"},
		// tenant=acme is an exact edge (tenant-ip's) with nowhere to go: the walk takes it
		// and stops, and does not go back to the key-only edge of tenant/user.
		{"no going back to a less specific edge", Attrs{Domain: "saas", Entries: entries("tenant", "acme", "user", "u1")}, ""},
		{"counted by ip in a prefix", Attrs{Domain: "saas", IP: netip.MustParseAddr("10.1.2.3"), Entries: entries("tenant", "acme")},
			"tenant-ip@ip:10.1.2.3×1"},
		{"outside the prefix", Attrs{Domain: "saas", IP: netip.MustParseAddr("192.0.2.1"), Entries: entries("tenant", "acme")}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(snap.Match(&tc.a, t0, nil)); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	// The override expires; the plan's rule takes over.
	a := Attrs{Domain: "saas", APIKey: "k1", Plan: "pro", Entries: entries("tenant", "globex", "user", "u1")}
	if got := ids(snap.Match(&a, t0.Add(2*60*60*1e9), nil)); !strings.HasPrefix(got, "tenant-pro@") {
		t.Errorf("after expiry: %s", got)
	}
	if r := snap.Rule("blocked"); !r.Refuses() || !NoTokens(r.Limits) || len(r.Limits) != 1 || r.Limits[0].Name != "blocked/refuse" {
		t.Errorf("blocked compiled to %+v", r.Limits)
	}
}

// Named rules and descriptor rules apply side by side: each dimension its winner.
func TestDescriptorBesideNamedRules(t *testing.T) {
	snap := mustCompile(t, specificitySet+strings.TrimPrefix(descriptorSet, "\nrules:\n"), CompileOptions{})
	a := Attrs{APIKey: "k9", Plan: "pro", Domain: "edge", Entries: entries("api_key", "k9", "remote_address", "192.0.2.1")}
	// api_key+remote_address is no path of edge's tree (it starts with remote_address).
	if got := ids(snap.Match(&a, t0, nil)); got != "pro@key:k9×1 shadow-pro@key:k9×1" {
		t.Errorf("got %s", got)
	}
	a.Entries = entries("remote_address", "192.0.2.1")
	if got := ids(snap.Match(&a, t0, nil)); got != "per-address@desc:edge/remote_address=192.0.2.1×1 pro@key:k9×1 shadow-pro@key:k9×1" {
		t.Errorf("got %s", got)
	}
}

func TestDescriptorIdentity(t *testing.T) {
	for _, tc := range []struct {
		domain string
		e      []Entry
		shared []string
		want   string
	}{
		{"d", entries("k", "v"), nil, "desc:d/k=v"},
		{"d", entries("k", ""), nil, "desc:d/k="},
		// The separators are escaped: these two never share a bucket.
		{"d", entries("a", "b/c=d"), nil, "desc:d/a=b%2Fc%3Dd"},
		{"d", entries("a", "b", "c", "d"), nil, "desc:d/a=b/c=d"},
		{"d/x", entries("k~", "100%"), nil, "desc:d%2Fx/k%7E=100%25"},
		{"d", entries("k", "v", "p", "/f/1"), []string{"", "/f/*"}, "desc:d/k=v/p~%2Ff%2F*"},
	} {
		if got := DescriptorIdentity(tc.domain, tc.e, tc.shared); got != tc.want {
			t.Errorf("DescriptorIdentity(%q, %v, %q) = %q, want %q", tc.domain, tc.e, tc.shared, got, tc.want)
		}
	}
	long := entries("k", strings.Repeat("v", 300), "k2", strings.Repeat("w", 300))
	id := DescriptorIdentity("d", long, nil)
	if !strings.HasPrefix(id, "desc:sha256:") || len(id) != len("desc:sha256:")+64 {
		t.Errorf("long identity %q", id)
	}
	long[1].Value += "x"
	if DescriptorIdentity("d", long, nil) == id {
		t.Error("two long descriptors share an identity")
	}
	if CountedBy(id) != "descriptor" || CountedBy("desc:d/k=v") != "descriptor" {
		t.Error("CountedBy of a descriptor identity")
	}
}

func TestDescriptorReplaces(t *testing.T) {
	snap := mustCompile(t, `
rules:
  - id: specific
    match: {domain: d, descriptor: [{key: k1, value: v1}, {key: user, value: bob}]}
    limits: [{name: s, rate: 5, per: 1s}]
  - id: override
    match: {domain: d, descriptor: [{key: k2, value: v2}, {key: user, value: bob}]}
    replaces: [specific]
    limits: [{name: s, rate: 10, per: 1s}]
  - id: default
    limits: [{name: s, rate: 100, per: 1s}]
    replaces: [nothing-here]
  - id: nothing-here
    by: global
    limits: [{name: s, rate: 100, per: 1s}]
`, CompileOptions{})
	if !snap.HasReplaces() {
		t.Fatal("HasReplaces false")
	}
	a1 := Attrs{APIKey: "k", Domain: "d", Entries: entries("k1", "v1", "user", "bob")}
	a2 := Attrs{APIKey: "k", Domain: "d", Entries: entries("k2", "v2", "user", "bob")}
	// Within one check: default replaces the global rule.
	if got := ids(DropReplaced(snap.Match(&a1, t0, nil), nil)); got != "specific@desc:d/k1=v1/user=bob×1 default@key:k×1" {
		t.Errorf("one check: %s", got)
	}
	// Across one request's descriptors: override replaces specific in the other one.
	rep := snap.Replacing(&a2, t0, snap.Replacing(&a1, t0, nil))
	if !reflect.DeepEqual(rep, []string{"nothing-here", "specific", "nothing-here"}) {
		t.Errorf("Replacing: %q", rep)
	}
	if got := ids(DropReplaced(snap.Match(&a1, t0, nil), rep)); got != "default@key:k×1" {
		t.Errorf("replaced: %s", got)
	}
	if got := ids(DropReplaced(snap.Match(&a2, t0, nil), rep)); got != "override@desc:d/k2=v2/user=bob×1 default@key:k×1" {
		t.Errorf("the replacing rule: %s", got)
	}
}

func TestDescriptorRuleErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"domain without descriptor", "  - id: x\n    match: {domain: d}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:3: rule "x": match.domain: "d" without match.descriptor`},
		{"descriptor without domain", "  - id: x\n    match: {descriptor: [{key: k}]}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`rule "x": match.domain: missing; a descriptor rule names the Envoy RLS domain`},
		{"by descriptor on a named rule", "  - id: x\n    by: descriptor\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:3: rule "x": by: descriptor without match.descriptor`},
		{"empty key", "  - id: x\n    match:\n      domain: d\n      descriptor:\n        - {value: v}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:6: rule "x": match.descriptor[0].key: missing`},
		{"shared without wildcard", "  - id: x\n    match: {domain: d, descriptor: [{key: k, value: v, shared: true}]}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`rule "x": match.descriptor[0].shared: only with a wildcard value`},
		{"unknown entry field", "  - id: x\n    match: {domain: d, descriptor: [{key: k, valeu: v}]}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:3: rule "x": match.descriptor[0].valeu: unknown field "valeu"`},
		{"unlimited with limits", "  - id: x\n    match: {domain: d, descriptor: [{key: k}]}\n    unlimited: true\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:5: rule "x": limits: 1 limits beside unlimited: true`},
		{"refuse and unlimited", "  - id: x\n    match: {domain: d, descriptor: [{key: k}]}\n    unlimited: true\n    refuse: true\n",
			`r.yaml:5: rule "x": refuse: beside unlimited: true`},
		{"no limits", "  - id: x\n    match: {domain: d, descriptor: [{key: k}]}\n",
			`rule "x": limits: missing; a rule needs at least one limit (or unlimited: true, or refuse: true)`},
		{"replaces an unknown id", "  - id: x\n    replaces: [y]\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:3: rule "x": replaces[0]: "y" is the id of no rule of the set`},
		{"replaces itself", "  - id: x\n    replaces: [x]\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:3: rule "x": replaces[0]: "x" is the rule itself`},
		{"shared one way and not the other", "  - id: x\n    match: {domain: d, descriptor: [{key: k, value: 'a*', shared: true}]}\n    limits: [{name: s, rate: 1, per: 1s}]\n" +
			"  - id: y\n    match: {domain: d, descriptor: [{key: k, value: 'a*'}]}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			`r.yaml:6: rule "y": match.descriptor[0].shared: false, but rule "x" matches the same entries with shared: true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckYAML([]byte("rules:\n"+tc.yaml), "r.yaml", CompileOptions{})
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v\nwant %s", err, tc.want)
			}
		})
	}
}

func TestDescriptorRuleRoundTrip(t *testing.T) {
	s := mustParse(t, descriptorSet)
	for i := range s.Rules {
		want := s.Rules[i]
		want.pos = nil
		b, err := EncodeRule(&want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRule(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		got.pos = nil
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("round trip of %s:\n got %+v\nwant %+v", b, *got, want)
		}
	}
	if s.Rules[0].By != ByDescriptor || s.Rules[len(s.Rules)-1].By != ByIP {
		t.Errorf("by: %v, %v", s.Rules[0].By, s.Rules[len(s.Rules)-1].By)
	}
}

func TestDescriptorCandidates(t *testing.T) {
	snap := mustCompile(t, descriptorSet, CompileOptions{})
	a := Attrs{Domain: "web", Entries: entries("path", "/api/v1/action")}
	var got []string
	for _, c := range snap.Candidates(&a, t0) {
		s := c.Rule.ID
		if c.Won {
			s += "*"
		}
		got = append(got, s)
	}
	if strings.Join(got, " ") != "api-action api-any path-exact* path-any" {
		t.Errorf("candidates %q", got)
	}
}

func TestDescriptorMatchAllocations(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are not meaningful under -cover or -race")
	}
	snap := mustCompile(t, descriptorSet, CompileOptions{})
	dst := make([]Matched, 0, 8)
	for _, a := range []Attrs{
		{Domain: "messaging", Entries: entries("message_type", "marketing", "to_number", "2061111111")}, // one identity
		{Domain: "saas", Plan: "pro", Entries: entries("tenant", "globex", "user", "u1")},               // one, for both rules
		{Domain: "web", Entries: entries("path", "/nowhere/at/all/but/long")},                           // path-any
		{Domain: "messaging", Entries: entries("message_type", "alert")},                                // nothing
	} {
		want := 1.0
		if a.Entries[0].Value == "alert" {
			want = 0
		}
		if n := testing.AllocsPerRun(200, func() { dst = snap.Match(&a, t0, dst[:0]) }); n > want {
			t.Errorf("Match(%v): %v allocs, want <= %v", a.Entries, n, want)
		}
	}
}

// BenchmarkMatchDescriptor is a nested descriptor rule's match (envoyproxy/ratelimit's
// "messaging" example) beside BenchmarkMatch's named-dimension cases.
func BenchmarkMatchDescriptor(b *testing.B) {
	snap := mustCompile(b, descriptorSet, CompileOptions{})
	for _, c := range []struct {
		name string
		a    Attrs
	}{
		{"nested", Attrs{Domain: "messaging", Entries: entries("message_type", "marketing", "to_number", "2061111111")}},
		{"wildcard", Attrs{Domain: "web", Entries: entries("path", "/api/v2/other")}},
		{"miss", Attrs{Domain: "messaging", Entries: entries("message_type", "alert", "to_number", "1")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]Matched, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				dst = snap.Match(&c.a, t0, dst[:0])
			}
		})
	}
}

// unlimited and refuse work in the named dimensions too: an internal key's override that
// lifts its limits, a plan that is refused.
func TestUnlimitedAndRefuseNamedRules(t *testing.T) {
	snap := mustCompile(t, `
rules:
  - id: default
    limits: [{name: s, rate: 10, per: 1s}]
  - id: internal
    match: {api_key: internal}
    expires_at: 2030-01-01T00:00:00Z
    unlimited: true
  - id: banned
    match: {plan: banned}
    refuse: true
`, CompileOptions{})
	for _, tc := range []struct {
		a    Attrs
		want string
	}{
		{Attrs{APIKey: "internal"}, ""},
		{Attrs{APIKey: "k"}, "default@key:k×1"},
		{Attrs{APIKey: "k", Plan: "banned"}, "banned@key:k×1"},
		{Attrs{APIKey: "internal", Plan: "banned"}, ""},
	} {
		if got := ids(snap.Match(&tc.a, t0, nil)); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.a, got, tc.want)
		}
	}
}
