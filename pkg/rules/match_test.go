package rules

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

var t0 = time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)

const specificitySet = `
version: v1
rules:
  - id: default
    limits: [{name: s, rate: 10, per: 1s}]
  - id: pro
    match: {plan: pro}
    limits: [{name: s, rate: 100, per: 1s}]
  - id: pro-search
    match: {plan: pro, endpoint: "GET /search"}
    limits: [{name: s, rate: 50, per: 1s}]
    cost: {"GET /search": 3}
  - id: search
    match: {endpoint: "GET /search"}
    limits: [{name: s, rate: 5, per: 1s}]
  - id: acme-org
    match: {org: acme}
    limits: [{name: s, rate: 200, per: 1s}]
  - id: key-k1
    match: {api_key: k1}
    expires_at: 2024-06-01T13:00:00Z
    limits: [{name: s, rate: 1000, per: 1s}]
  - id: key-k1-search
    match: {api_key: k1, endpoint: "GET /search"}
    expires_at: 2024-06-01T12:30:00Z
    limits: [{name: s, rate: 2000, per: 1s}]
  - id: office
    match: {ip: 10.0.0.0/8}
    limits: [{name: s, rate: 7, per: 1s}]
  - id: office-lab
    match: {ip: 10.1.0.0/16}
    limits: [{name: s, rate: 8, per: 1s}]
  - id: ip-default
    by: ip
    limits: [{name: s, rate: 30, per: 1s}]
  - id: ip-v6-block
    by: ip
    match: {ip: "2001:db8::/32"}
    limits: [{name: s, rate: 3, per: 1s}]
  - id: global-search
    by: global
    match: {endpoint: "GET /search"}
    limits: [{name: s, rate: 100000, per: 1s}]
  - id: shadow-pro
    mode: shadow
    match: {plan: pro}
    limits: [{name: s, rate: 80, per: 1s}]
  - id: shadow-default
    mode: shadow
    limits: [{name: s, rate: 9, per: 1s}]
`

// ids renders what Match returned as "id@identity×cost" in order.
func ids(ms []Matched) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s@%s×%d", m.Rule.ID, m.Identity, m.Cost))
	}
	return strings.Join(out, " ")
}

func TestMatchSpecificity(t *testing.T) {
	snap := mustCompile(t, specificitySet, CompileOptions{})
	ip := netip.MustParseAddr
	tests := []struct {
		name string
		a    Attrs
		at   time.Time
		want string
	}{
		// Neither key nor IP: rules counted by api_key or ip count one shared bucket set.
		{"nothing known", Attrs{}, t0, "default@anonymous×1 shadow-default@anonymous×1 ip-default@anonymous×1"},
		{"default", Attrs{APIKey: "k9"}, t0, "default@key:k9×1 shadow-default@key:k9×1"},
		{"plan", Attrs{APIKey: "k9", Plan: "pro"}, t0, "pro@key:k9×1 shadow-pro@key:k9×1"},
		{"plan+endpoint beats plan", Attrs{APIKey: "k9", Plan: "pro", Endpoint: "GET /search"}, t0,
			"pro-search@key:k9×3 shadow-pro@key:k9×1 global-search@global×1"},
		{"endpoint alone", Attrs{APIKey: "k9", Plan: "free", Endpoint: "GET /search"}, t0,
			"search@key:k9×1 shadow-default@key:k9×1 global-search@global×1"},
		{"org beats plan+endpoint", Attrs{APIKey: "k9", Plan: "pro", Org: "acme", Endpoint: "GET /search"}, t0,
			"acme-org@key:k9×1 shadow-pro@key:k9×1 global-search@global×1"},
		{"key override beats all", Attrs{APIKey: "k1", Plan: "pro", Org: "acme"}, t0, "key-k1@key:k1×1 shadow-pro@key:k1×1"},
		{"key+endpoint beats key", Attrs{APIKey: "k1", Plan: "pro", Endpoint: "GET /search"}, t0,
			"key-k1-search@key:k1×1 shadow-pro@key:k1×1 global-search@global×1"},
		{"key+endpoint expired falls to key", Attrs{APIKey: "k1", Plan: "pro", Endpoint: "GET /search"}, t0.Add(30 * time.Minute),
			"key-k1@key:k1×1 shadow-pro@key:k1×1 global-search@global×1"},
		{"both expired fall to plan+endpoint", Attrs{APIKey: "k1", Plan: "pro", Endpoint: "GET /search"}, t0.Add(time.Hour),
			"pro-search@key:k1×3 shadow-pro@key:k1×1 global-search@global×1"},
		{"longer prefix wins", Attrs{APIKey: "k9", IP: ip("10.1.2.3")}, t0,
			"office-lab@key:k9×1 shadow-default@key:k9×1 ip-default@ip:10.1.2.3×1"},
		{"shorter prefix", Attrs{APIKey: "k9", IP: ip("10.2.2.3")}, t0,
			"office@key:k9×1 shadow-default@key:k9×1 ip-default@ip:10.2.2.3×1"},
		{"ip beats default, plan beats ip", Attrs{APIKey: "k9", Plan: "pro", IP: ip("10.1.2.3")}, t0,
			"pro@key:k9×1 shadow-pro@key:k9×1 ip-default@ip:10.1.2.3×1"},
		{"ipv4-mapped is ipv4", Attrs{APIKey: "k9", IP: ip("::ffff:10.1.2.3")}, t0,
			"office-lab@key:k9×1 shadow-default@key:k9×1 ip-default@ip:10.1.2.3×1"},
		// Keyless: the rules counted by api_key count the client (IPv6 per /64) instead.
		{"ipv6 counted per /64", Attrs{IP: ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")}, t0,
			"default@ip6:2001:db8:1:2::/64×1 shadow-default@ip6:2001:db8:1:2::/64×1 ip-v6-block@ip6:2001:db8:1:2::/64×1"},
		{"ipv6 other block", Attrs{IP: ip("2a00::1%eth0")}, t0, "default@ip6:2a00::/64×1 shadow-default@ip6:2a00::/64×1 ip-default@ip6:2a00::/64×1"},
		{"keyless ipv4 counted by ip", Attrs{IP: ip("192.0.2.7")}, t0, "default@ip:192.0.2.7×1 shadow-default@ip:192.0.2.7×1 ip-default@ip:192.0.2.7×1"},
		{"keyed without ip: no ip rule", Attrs{APIKey: "k9", Org: "x"}, t0, "default@key:k9×1 shadow-default@key:k9×1"},
		{"no key, no ip", Attrs{Org: "acme"}, t0, "acme-org@anonymous×1 shadow-default@anonymous×1 ip-default@anonymous×1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ids(snap.Match(&tt.a, tt.at, nil))
			if got != tt.want {
				t.Errorf("Match(%+v)\n got  %s\n want %s", tt.a, got, tt.want)
			}
		})
	}
}

func TestMatchIPv6PrefixOption(t *testing.T) {
	snap := mustCompile(t, "rules:\n  - id: ip\n    by: ip\n    limits: [{name: s, rate: 1, per: 1s}]\n", CompileOptions{IPv6Prefix: 48})
	got := ids(snap.Match(&Attrs{IP: netip.MustParseAddr("2001:db8:1:2::9")}, t0, nil))
	if got != "ip@ip6:2001:db8:1::/48×1" {
		t.Fatal(got)
	}
}

// Ties in specificity and prefix length go to the rule written first, whatever the order
// the index happens to hold them in.
func TestMatchTieGoesToFirstRule(t *testing.T) {
	in := "rules:\n  - id: first\n    limits: [{name: s, rate: 1, per: 1s}]\n  - id: second\n    limits: [{name: s, rate: 1, per: 1s}]\n"
	snap := mustCompile(t, in, CompileOptions{})
	if got := ids(snap.Match(&Attrs{APIKey: "k"}, t0, nil)); got != "first@key:k×1" {
		t.Fatal(got)
	}
}

// An override stops applying at expires_at, on a fake clock, with no new push.
func TestOverrideExpiresOnTime(t *testing.T) {
	clk := clock.NewFake(t0)
	snap := mustCompile(t, specificitySet, CompileOptions{Now: clk.Now()})
	a := &Attrs{APIKey: "k1", Plan: "pro"}
	steps := []struct {
		advance time.Duration
		want    string
	}{
		{0, "key-k1"},
		{59*time.Minute + 59*time.Second, "key-k1"},
		{time.Second - time.Nanosecond, "key-k1"},
		{time.Nanosecond, "pro"}, // exactly 13:00:00: expired
		{time.Hour, "pro"},
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		got := snap.Match(a, clk.Now(), nil)
		if len(got) == 0 || got[0].Rule.ID != st.want {
			t.Fatalf("step %d at %v: got %s, want %s first", i, clk.Now(), ids(got), st.want)
		}
	}
	if ne := snap.NextExpiry(t0); !ne.Equal(t0.Add(30 * time.Minute)) {
		t.Fatalf("NextExpiry = %v", ne)
	}
}

func TestCompiledLimitsAndShares(t *testing.T) {
	in := `
rules:
  - id: r
    limits:
      - {name: second, rate: 100, per: 1s, burst: 200}
      - {name: minute, rate: 6000, per: 1m}
    cost: {"POST /big": 10}
    shares: {us-east: 0.5, eu-west: 0}
`
	snap := mustCompile(t, in, CompileOptions{Region: "us-east"})
	c := snap.Rule("r")
	if c.Share != 0.5 || c.Policy != "r" {
		t.Fatalf("%+v", c)
	}
	if l := c.Limits[0]; l.Name != "r/second" || l.Rate != 50 || l.Burst != 100 {
		t.Fatalf("second: %+v", l)
	}
	if l := c.Limits[1]; l.Name != "r/minute" || l.Rate != 50 || l.Burst != 3000 {
		t.Fatalf("minute: %+v", l)
	}
	// A region not listed shares the rest (1 - 0.5 - 0) with the other unlisted regions,
	// by weight: ap-south 1 of 1+3.
	c = mustCompile(t, in, CompileOptions{Region: "ap-south", Regions: map[string]float64{"us-east": 1, "eu-west": 1, "ap-south": 1, "sa-east": 3}}).Rule("r")
	if c.Share != 0.125 || c.Limits[0].Rate != 12.5 || c.Limits[0].Burst != 25 {
		t.Fatalf("default share: %+v", c)
	}
	// The global limits are kept unscaled beside the scaled ones.
	if g := c.Global; len(g) != 2 || g[0] != (bucket.Limit{Name: "r/second", Rate: 100, Burst: 200}) || g[1] != (bucket.Limit{Name: "r/minute", Rate: 100, Burst: 6000}) {
		t.Fatalf("global: %+v", g)
	}
	// Without regions (one region) an unlisted region gets the whole limit.
	c = mustCompile(t, in, CompileOptions{Region: "ap-south"}).Rule("r")
	if c.Share != 1 || c.Limits[0].Rate != 100 || c.Limits[0].Burst != 200 {
		t.Fatalf("single region: %+v", c)
	}
	// Share 0 holds no tokens: the region refuses (no store is asked).
	c = mustCompile(t, in, CompileOptions{Region: "eu-west"}).Rule("r")
	if l := c.Limits[0]; l.Burst != 0 || l.Rate != 0 || !NoTokens(c.Limits) {
		t.Fatalf("share 0: %+v", l)
	}
	if m := snap.Match(&Attrs{APIKey: "k", Endpoint: "POST /big"}, t0, nil); m[0].Cost != 10 {
		t.Fatalf("cost %d", m[0].Cost)
	}
}

func TestVersionIsContentHashWhenUnset(t *testing.T) {
	in := "rules:\n  - id: a\n    limits: [{name: s, rate: 1, per: 1s}]\n"
	a := mustCompile(t, in, CompileOptions{Now: t0})
	b := mustCompile(t, in, CompileOptions{})
	c := mustCompile(t, strings.Replace(in, "rate: 1", "rate: 2", 1), CompileOptions{})
	if !strings.HasPrefix(a.Version(), "sha256:") || a.Version() != b.Version() || a.Version() == c.Version() {
		t.Fatalf("versions %q %q %q", a.Version(), b.Version(), c.Version())
	}
	if !a.Created().Equal(t0) || a.Len() != 1 || len(a.Rules()) != 1 {
		t.Fatalf("created %v len %d", a.Created(), a.Len())
	}
	if v := mustCompile(t, "version: x7\n"+in, CompileOptions{}).Version(); v != "x7" {
		t.Fatal(v)
	}
}

func TestMatchDoesNotAllocateForAKnownIdentity(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are not meaningful under -cover or -race")
	}
	snap := mustCompile(t, specificitySet, CompileOptions{})
	dst := make([]Matched, 0, 8)
	for _, a := range []Attrs{
		{APIKey: "k9", Plan: "pro", Endpoint: "GET /search", IP: netip.MustParseAddr("10.1.2.3")}, // key:, ip:
		{APIKey: "k9", Endpoint: "GET /search", IP: netip.MustParseAddr("2001:db8::1")},
		{Endpoint: "GET /search"}, // only "global"
	} {
		// AllocsPerRun's warm-up run builds the identities; the runs it counts find them.
		if n := testing.AllocsPerRun(200, func() { dst = snap.Match(&a, t0, dst[:0]) }); n != 0 {
			t.Errorf("Match(%+v): %v allocs, want 0", a, n)
		}
	}
}

// The identity cache hands every check of an identity the same string, and the right
// one whatever collides in it: 200,000 keys, addresses and prefixes through a cache of
// 65,536 slots, twice, from two goroutines.
func TestMatchInternsIdentities(t *testing.T) {
	snap := mustCompile(t, "rules:\n  - id: k\n    limits: [{name: s, rate: 1, per: 1s}]\n  - id: o\n    by: org\n    limits: [{name: s, rate: 1, per: 1s}]\n  - id: ip\n    by: ip\n    limits: [{name: s, rate: 1, per: 1s}]\n", CompileOptions{IPv6Prefix: 48})
	a := Attrs{APIKey: "alice", Org: "acme", IP: netip.MustParseAddr("10.0.0.1")}
	first := snap.Match(&a, t0, nil)
	again := snap.Match(&Attrs{APIKey: strings.Clone("alice"), Org: strings.Clone("acme"), IP: netip.MustParseAddr("10.0.0.1")}, t0, nil)
	if len(first) != 3 || len(again) != 3 {
		t.Fatalf("matched %d and %d rules, want 3", len(first), len(again))
	}
	for i := range first {
		if unsafe.StringData(first[i].Identity) != unsafe.StringData(again[i].Identity) {
			t.Errorf("%s: two checks got two copies of %q", first[i].Rule.ID, first[i].Identity)
		}
	}
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			dst := make([]Matched, 0, 4)
			for round := range 2 {
				for i := range 200_000 {
					i := (i + g*7919) % 200_000
					ip := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
					if i%2 == 1 {
						ip = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 16), byte(i >> 8), byte(i), 9: 1})
					}
					a := Attrs{APIKey: fmt.Sprintf("key-%d", i), Org: fmt.Sprintf("org-%d", i%1000), IP: ip}
					dst = snap.Match(&a, t0, dst[:0])
					want := map[string]string{"k": "key:" + a.APIKey, "o": "org:" + a.Org, "ip": "ip:" + ip.String()}
					if i%2 == 1 {
						want["ip"] = "ip6:" + netip.PrefixFrom(ip, 48).Masked().String()
					}
					for _, m := range dst {
						if m.Identity != want[m.Rule.ID] {
							t.Errorf("round %d, %+v: rule %s counts %q, want %q", round, a, m.Rule.ID, m.Identity, want[m.Rule.ID])
							return
						}
					}
					if len(dst) != 3 {
						t.Errorf("round %d, %+v: matched %d rules, want 3", round, a, len(dst))
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// Readers never see a torn snapshot while another goroutine swaps them (run with -race).
func TestHolderAtomicSwap(t *testing.T) {
	a := mustCompile(t, "version: a\nrules:\n  - id: a\n    limits: [{name: s, rate: 1, per: 1s}]\n", CompileOptions{})
	b := mustCompile(t, "version: b\nrules:\n  - id: b\n    limits: [{name: s, rate: 1, per: 1s}]\n", CompileOptions{})
	h := NewHolder(a)
	sub, cancel := h.Subscribe()
	defer cancel()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]Matched, 0, 4)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := h.Current()
				dst = s.Match(&Attrs{APIKey: "k"}, t0, dst[:0])
				if len(dst) != 1 || dst[0].Rule.ID != s.Version() {
					t.Errorf("snapshot %s matched %s", s.Version(), ids(dst))
					return
				}
			}
		}()
	}
	for i := range 2000 {
		if i%2 == 0 {
			h.Store(b)
		} else {
			h.Store(a)
		}
	}
	close(stop)
	wg.Wait()
	if got := <-sub; got != a {
		t.Fatalf("subscriber got %s, want the newest (a)", got.Version())
	}
	h.Store(nil) // ignored
	if h.Current() != a {
		t.Fatal("Store(nil) replaced the snapshot")
	}
	if e := NewHolder(nil).Current(); e == nil || e.Len() != 0 || len(e.Match(&Attrs{APIKey: "k"}, t0, nil)) != 0 {
		t.Fatal("empty holder")
	}
}

func BenchmarkMatch(b *testing.B) {
	// A realistic snapshot: a handful of plan/endpoint rules and 10,000 per-key overrides.
	var sb strings.Builder
	sb.WriteString(specificitySet)
	for i := range 10000 {
		fmt.Fprintf(&sb, "  - id: ovr-%d\n    match: {api_key: key-%d}\n    expires_at: 2030-01-01T00:00:00Z\n    limits: [{name: s, rate: 5, per: 1s}]\n", i, i)
	}
	snap := mustCompile(b, sb.String(), CompileOptions{})
	cases := []struct {
		name string
		a    Attrs
	}{
		{"default-key", Attrs{APIKey: "someone", Plan: "free"}},
		{"override-key", Attrs{APIKey: "key-4242", Plan: "pro", Endpoint: "GET /search"}},
		{"plan-endpoint-ip4", Attrs{APIKey: "someone", Plan: "pro", Endpoint: "GET /search", IP: netip.MustParseAddr("10.1.2.3")}},
		{"ip6", Attrs{APIKey: "someone", IP: netip.MustParseAddr("2001:db8:1:2::77")}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]Matched, 0, 8)
			b.ReportAllocs()
			for b.Loop() {
				dst = snap.Match(&c.a, t0, dst[:0])
			}
		})
	}
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		a := cases[2].a
		b.RunParallel(func(pb *testing.PB) {
			dst := make([]Matched, 0, 8)
			for pb.Next() {
				dst = snap.Match(&a, t0, dst[:0])
			}
		})
	})
}

func TestWordsRoundTrip(t *testing.T) {
	for w, m := range modeWords {
		if w != "" && m.String() != w {
			t.Errorf("mode %q → %v", w, m)
		}
	}
	for w, f := range failWords {
		if w != "" && f.String() != w {
			t.Errorf("fail_mode %q → %v", w, f)
		}
	}
	for w, b := range byWords {
		if w != "" && b.String() != w {
			t.Errorf("by %q → %v", w, b)
		}
	}
	if Mode(9).String() != "unknown" || FailMode(9).String() != "unknown" || By(9).String() != "unknown" {
		t.Error("unknown values")
	}
}

// BenchmarkCompile measures a whole rebuild (what every etcd change costs) of a set with
// 10,000 per-key overrides.
func BenchmarkCompile(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(specificitySet)
	for i := range 10000 {
		fmt.Fprintf(&sb, "  - id: ovr-%d\n    match: {api_key: key-%d}\n    expires_at: 2030-01-01T00:00:00Z\n    limits: [{name: s, rate: 5, per: 1s}]\n", i, i)
	}
	set := mustParse(b, sb.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(set, CompileOptions{Region: "us-east"}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestCountedBy(t *testing.T) {
	for id, want := range map[string]string{
		"key:k1": "api_key", "ip:192.0.2.7": "ip", "ip6:2001:db8::/64": "ip", "org:acme": "org",
		"ep:GET /x": "endpoint", "global": "global", Anonymous: "anonymous", "": "", "key:": "",
	} {
		if got := CountedBy(id); got != want {
			t.Errorf("CountedBy(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestExampleLimitsKeylessPerIP: the shipped example rules limit keyless traffic per IP
// (IPv6 per /64) and keyless, addressless traffic as one anonymous caller.
func TestExampleLimitsKeylessPerIP(t *testing.T) {
	set, err := LoadFile("../../configs/rules/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := Compile(set, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		a    Attrs
		want string
	}{
		{Attrs{IP: netip.MustParseAddr("192.0.2.1")}, "default@ip:192.0.2.1×1 per-ip-cap@ip:192.0.2.1×1"},
		{Attrs{IP: netip.MustParseAddr("2001:db8:7:8::1")}, "default@ip6:2001:db8:7:8::/64×1 per-ip-cap@ip6:2001:db8:7:8::/64×1"},
		// Invented keys from one address: each its own key bucket, all one per-IP cap.
		{Attrs{APIKey: "k_made_up_1", IP: netip.MustParseAddr("192.0.2.1")}, "default@key:k_made_up_1×1 per-ip-cap@ip:192.0.2.1×1"},
		{Attrs{APIKey: "k_made_up_2", IP: netip.MustParseAddr("192.0.2.1")}, "default@key:k_made_up_2×1 per-ip-cap@ip:192.0.2.1×1"},
		{Attrs{IP: netip.MustParseAddr("192.0.2.1"), Endpoint: "POST /v1/login"}, "default@ip:192.0.2.1×1 login-per-ip@ip:192.0.2.1×1"},
		{Attrs{Endpoint: "POST /v1/login"}, "default@anonymous×1 login-per-ip@anonymous×1"},
		{Attrs{}, "default@anonymous×1 per-ip-cap@anonymous×1"},
	} {
		if got := ids(snap.Match(&tc.a, t0, nil)); got != tc.want {
			t.Errorf("Match(%+v) = %s, want %s", tc.a, got, tc.want)
		}
	}
}
