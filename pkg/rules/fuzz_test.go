package rules

import (
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

func FuzzParseYAML(f *testing.F) {
	if b, err := os.ReadFile("../../configs/rules/example.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(specificitySet))
	f.Add([]byte(descriptorSet))
	f.Add([]byte(`{"rules":[{"id":"a","limits":[{"name":"s","rate":5,"per":"1s","burst":9}],"cost":{"x":3},"shares":{"us-east":0.1}}]}`))
	f.Add([]byte("rules:\n  - id: a\n    match: {ip: \"::ffff:10.0.0.0/104\"}\n    by: ip\n    limits: [{name: s, rate: 1e-3, per: 24h, burst: 1}]\n"))
	f.Add([]byte("rules: [{id: a, limits: [{name: s, rate: .inf, per: 1ns}]}]\n"))
	f.Add([]byte("a: &a [*a, *a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseYAML(data)
		if err != nil {
			if s != nil {
				t.Fatal("error with a set")
			}
			return
		}
		verr := s.Validate()
		for _, region := range []string{"", "us-east"} {
			snap, err := Compile(s, CompileOptions{Region: region})
			if (err == nil) != (verr == nil) {
				t.Fatalf("Validate said %v but Compile said %v", verr, err)
			}
			if err != nil {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("error does not wrap ErrInvalid: %v", err)
				}
				return
			}
			// Every compiled rule is a request a store accepts, at its largest cost too,
			// unless its limits hold no tokens in this region or it has none (unlimited):
			// no store is asked then, nor for a rule of only in-flight or calendar limits.
			for _, c := range snap.Rules() {
				if NoTokens(c.Limits) || c.Unlimited || len(c.Limits) == 0 {
					continue
				}
				req := bucket.Request{Identity: "key:x", Limits: c.Limits, Want: 1}
				for _, r := range s.Rules {
					if r.ID == c.ID {
						for _, cost := range r.Cost {
							req.Want = max(req.Want, cost)
						}
					}
				}
				if err := req.Validate(); err != nil {
					t.Fatalf("rule %s compiled to a bad request: %v", c.ID, err)
				}
			}
			a := Attrs{APIKey: "k", Plan: "pro", Org: "o", Endpoint: "GET /", IP: netip.MustParseAddr("10.1.2.3")}
			checkMatch(t, snap, &a, t0)
			for _, r := range s.Rules {
				if d := r.Match.Descriptor; len(d) > 0 {
					// A request descriptor made of the rule's own entries (any: "v", a
					// wildcard: the wildcard read literally, which it matches).
					a := Attrs{APIKey: "k", Plan: "pro", Domain: r.Match.Domain}
					for _, e := range d {
						v := e.Value
						if v == "" {
							v = "v"
						}
						a.Entries = append(a.Entries, Entry{e.Key, v})
					}
					checkDescriptorMatch(t, snap, &a, t0)
				}
			}
		}
		// With regions: the default split of every rule is in [0, 1] per region and sums
		// to at most 1, and each region's limits are its share of the global ones.
		regions := map[string]float64{"us-east": 2, "eu-west": 1, "ap-south": 1}
		snap, err := Compile(s, CompileOptions{Region: "eu-west", Regions: regions})
		if err != nil {
			return // a shares: entry naming another region
		}
		for _, c := range snap.Rules() {
			sum := 0.0
			for _, v := range c.Split {
				if !(v >= 0 && v <= 1) {
					t.Fatalf("rule %s: split %v", c.ID, c.Split)
				}
				sum += v
			}
			if sum > 1+1e-9 || c.Share != c.Split["eu-west"] {
				t.Fatalf("rule %s: split %v sums to %g (share %g)", c.ID, c.Split, sum, c.Share)
			}
			for i, l := range c.LimitsFor(c.Share, nil) {
				if l != c.Limits[i] {
					t.Fatalf("rule %s: LimitsFor(Share) %+v, Limits %+v", c.ID, l, c.Limits[i])
				}
			}
			// The regions' bursts and rates sum to at most the global ones (docs/design.md §9).
			for i, g := range c.Global {
				burst, rate := 0.0, 0.0
				for _, v := range c.Split {
					l := c.LimitsFor(v, nil)[i]
					burst += l.Burst
					rate += l.Rate
				}
				if burst > g.Burst+1e-6 || rate > g.Rate*(1+1e-9) {
					t.Fatalf("rule %s limit %d: split %v gives bursts summing to %g, rates to %g, global %+v", c.ID, i, c.Split, burst, rate, g)
				}
			}
		}
	})
}

// FuzzDescriptorMatch walks the descriptor rules of descriptorSet with any descriptor.
func FuzzDescriptorMatch(f *testing.F) {
	f.Add("messaging", "message_type", "marketing", "to_number", "2061111111", "pro")
	f.Add("web", "path", "/files/a", "", "", "")
	f.Add("web", "path", "/api/*/action", "x", "y", "")
	f.Add("saas", "tenant", "acme", "user", "u1", "pro")
	snap := mustCompile(f, descriptorSet, CompileOptions{})
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2, plan string) {
		a := Attrs{Domain: domain, Plan: plan, Entries: []Entry{{k1, v1}}}
		if k2 != "" {
			a.Entries = append(a.Entries, Entry{k2, v2})
		}
		checkDescriptorMatch(t, snap, &a, t0)
	})
}

// checkDescriptorMatch checks the shape of what Match gives for a request descriptor:
// at most one enforcing and one shadow descriptor rule, each fitting the descriptor,
// limited, with a bounded identity.
func checkDescriptorMatch(t *testing.T, snap *Snapshot, a *Attrs, now time.Time) {
	t.Helper()
	var modes [2]int
	for _, m := range snap.Match(a, now, nil) {
		if len(m.Rule.Match.Descriptor) == 0 {
			continue
		}
		modes[m.Rule.Mode]++
		var cr *crule
		for i := range snap.rules {
			if &snap.rules[i].c == m.Rule {
				cr = &snap.rules[i]
			}
		}
		switch {
		case cr == nil || !cr.fitsDescriptor(a):
			t.Fatalf("Match(%+v) gave %s, whose descriptor does not fit", a, m.Rule.ID)
		case m.Rule.Unlimited:
			t.Fatalf("Match(%+v) gave the unlimited %s", a, m.Rule.ID)
		case m.Identity == "" || len(m.Identity) > bucket.MaxIdentityLen || m.Cost < 1:
			t.Fatalf("bad match %+v", m)
		}
	}
	if modes[0] > 1 || modes[1] > 1 {
		t.Fatalf("Match(%+v): %v descriptor rules by mode", a, modes)
	}
}

func FuzzMatch(f *testing.F) {
	f.Add("k1", "pro", "acme", "GET /search", []byte{10, 1, 2, 3}, int64(0))
	f.Add("k9", "free", "", "", []byte{0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, int64(time.Hour))
	f.Add("", "", "", "", []byte{}, int64(-1))
	f.Add("k1", "pro", "", "GET /search", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}, int64(30*time.Minute))
	snap := mustCompile(f, specificitySet, CompileOptions{})
	f.Fuzz(func(t *testing.T, key, plan, org, ep string, ip []byte, offset int64) {
		a := Attrs{APIKey: key, Plan: plan, Org: org, Endpoint: ep}
		a.IP, _ = netip.AddrFromSlice(ip)
		checkMatch(t, snap, &a, t0.Add(time.Duration(offset)))
	})
}

// checkMatch compares Match with a plain scan of every rule (the definition of most
// specific wins) and checks the shape of each result.
func checkMatch(t *testing.T, snap *Snapshot, a *Attrs, now time.Time) {
	t.Helper()
	got := snap.Match(a, now, nil)
	ip := a.IP.Unmap().WithZone("")
	var want []*crule
	for by := range By(numBy) {
		if _, ok := snap.identity(by, a, ip); !ok {
			continue
		}
		for mode := range Mode(2) {
			var best *crule
			for i := range snap.rules {
				r := &snap.rules[i]
				// Descriptor rules are the tree's (a has no entries here: checkDescriptorMatch).
				if r.desc == nil && r.c.By == by && r.c.Mode == mode && r.matches(a, ip, now) && (best == nil || better(r, best) < 0) {
					best = r
				}
			}
			if best != nil && !best.c.Unlimited { // an unlimited winner takes nothing
				want = append(want, best)
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("Match(%+v) = %s; plain scan finds %d rules", a, ids(got), len(want))
	}
	for i, m := range got {
		if m.Rule != &want[i].c {
			t.Fatalf("Match(%+v)[%d] = %s, plain scan says %s", a, i, m.Rule.ID, want[i].c.ID)
		}
		if m.Identity == "" || m.Cost < 1 {
			t.Fatalf("bad match %+v", m)
		}
		if !m.Rule.ExpiresAt.IsZero() && !now.Before(m.Rule.ExpiresAt) {
			t.Fatalf("expired rule %s matched at %v", m.Rule.ID, now)
		}
	}
}
