package enforcer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/rules"
)

const descriptorRules = `
rules:
  - id: marketing
    match:
      domain: messaging
      descriptor: [{key: message_type, value: marketing}, {key: to_number}]
    limits: [{name: day, rate: 2, per: 24h}]
  - id: blocked
    match: {domain: messaging, descriptor: [{key: to_number, value: "911"}]}
    refuse: true
  - id: free
    match: {domain: messaging, descriptor: [{key: to_number}]}
    unlimited: true
  - id: specific
    match: {domain: messaging, descriptor: [{key: k1, value: v1}, {key: user, value: bob}]}
    limits: [{name: second, rate: 1, per: 1s}]
  - id: override
    match: {domain: messaging, descriptor: [{key: k2, value: v2}, {key: user, value: bob}]}
    replaces: [specific]
    limits: [{name: second, rate: 3, per: 1s}]
`

func msg(kv ...string) rules.Attrs {
	a := rules.Attrs{Domain: "messaging"}
	for i := 0; i+1 < len(kv); i += 2 {
		a.Entries = append(a.Entries, rules.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return a
}

// Each value of an any-value entry has its own bucket; refuse refuses without a store;
// unlimited takes nothing.
func TestDescriptorChecks(t *testing.T) {
	u := &usageLog{}
	r := newRig(t, descriptorRules, nil, func(c *Config) { c.Usage = u })
	for _, n := range []string{"2061111111", "2062222222"} {
		ok, last := r.admitted(t, 3, msg("message_type", "marketing", "to_number", n))
		if ok != 2 || last.Allowed || last.Rule != "marketing" || last.CountedBy != "descriptor" {
			t.Fatalf("%s: %d admitted, last %+v; want 2 then refused by marketing", n, ok, last)
		}
	}
	d := r.check(t, msg("to_number", "911"))
	if d.Allowed || d.Rule != "blocked" || d.Source != SourceRefusalCache || d.Quota != 0 || d.Window != 1 || d.RetryAfter <= 0 {
		t.Fatalf("blocked: %+v", d)
	}
	if ok, last := r.admitted(t, 100, msg("to_number", "2061111111")); ok != 100 || last.Rule != "" {
		t.Fatalf("unlimited: %d admitted, last %+v", ok, last)
	}
	for _, take := range u.takes {
		if strings.HasPrefix(take, "blocked ") {
			t.Errorf("a refuse rule's refusal is reported as demand: %q", take)
		}
	}
}

// A rule of one descriptor replaces a rule of another descriptor of the same request.
func TestJoinReplaces(t *testing.T) {
	r := newRig(t, descriptorRules, nil)
	reqs := []Request{
		{Attrs: msg("k1", "v1", "user", "bob")},
		{Attrs: msg("k2", "v2", "user", "bob")},
	}
	for i := range reqs {
		if err := r.e.Validate(&reqs[i]); err != nil {
			t.Fatal(err)
		}
	}
	r.e.JoinReplaces(reqs)
	if len(reqs[0].Replaced) != 1 || reqs[0].Replaced[0] != "specific" {
		t.Fatalf("Replaced %q", reqs[0].Replaced)
	}
	for i := 0; i < 5; i++ {
		d, err := r.e.Check(context.Background(), &reqs[0])
		if err != nil || !d.Allowed || d.Rule != "" {
			t.Fatalf("replaced rule still applies: %+v %v", d, err)
		}
	}
	// Alone, the first descriptor is held to its own rule.
	if ok, _ := r.admitted(t, 3, msg("k1", "v1", "user", "bob")); ok != 1 {
		t.Fatalf("specific alone admitted %d, want 1", ok)
	}
	one := []Request{{Attrs: msg("k1", "v1", "user", "bob")}}
	r.e.JoinReplaces(one)
	if one[0].Replaced != nil {
		t.Errorf("one check: Replaced %q", one[0].Replaced)
	}
}

func TestDescriptorInputLimits(t *testing.T) {
	r := newRig(t, descriptorRules, nil)
	long := strings.Repeat("x", 300)
	for _, a := range []rules.Attrs{
		{Domain: strings.Repeat("d", 200)},
		msg("", "v"),
		msg(long[:65], "v"),
		msg("k", long),
		msg("a", "1", "b", "2", "c", "3", "d", "4", "e", "5", "f", "6", "g", "7", "h", "8", "i", "9"),
	} {
		if _, err := r.e.Check(context.Background(), &Request{Attrs: a}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%.80v: %v, want ErrInvalid", a, err)
		}
	}
}

// BenchmarkCheckDescriptor is BenchmarkCheck with a nested descriptor rule (the
// "messaging" example of envoyproxy/ratelimit's README: a message type's value, then each
// number its own bucket) beside today's named-dimension rules, as the Envoy RLS front end
// passes a descriptor: its entries, and the attributes the key map finds in them.
func BenchmarkCheckDescriptor(b *testing.B) {
	r := newRig(b, benchRules+`
  - id: marketing
    match:
      domain: messaging
      descriptor: [{key: message_type, value: marketing}, {key: to_number}]
    limits: [{name: day, rate: 1000000, per: 1s}]
`, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) }, func(c *Config) { c.Clock = clock.Real() })
	reqs := benchKeys(1024)
	for i := range reqs {
		reqs[i].Attrs.Domain = "messaging"
		reqs[i].Attrs.Entries = []rules.Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: reqs[i].Attrs.APIKey}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
			b.Fatal(err)
		}
	}
}
