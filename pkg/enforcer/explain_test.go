package enforcer

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/rules"
)

const explainRules = `
rules:
  - id: default
    limits: [{name: second, rate: 10, per: 1s, burst: 20}]
  - id: pro
    match: {plan: pro}
    limits:
      - {name: second, rate: 100, per: 1s, burst: 200}
      - {name: minute, rate: 6000, per: 1m}
  - id: acme
    match: {api_key: acme}
    limits: [{name: second, rate: 500, per: 1s}]
    expires_at: 2026-03-01T11:00:00Z
    reason: launch week (expired)
  - id: per-ip
    by: ip
    limits: [{name: second, rate: 50, per: 1s}]
`

// statusShares is a Shares with a ShareStatus: one identity at 0.25, set (7, 42), 3 s old.
type statusShares struct{ mapShares }

func (*statusShares) Applied() (int64, uint64)    { return 7, 42 }
func (*statusShares) Age(time.Time) time.Duration { return 3 * time.Second }
func (*statusShares) Stale(time.Time) bool        { return false }
func explainOf(t *testing.T, r *rig, a rules.Attrs, admin bool) Explanation {
	t.Helper()
	x, err := r.e.Explain(context.Background(), &Request{Attrs: a}, admin)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func ruleOf(t *testing.T, x Explanation, id string) RuleExplain {
	t.Helper()
	for _, re := range x.Rules {
		if re.Rule == id {
			return re
		}
	}
	t.Fatalf("no rule %q in %+v", id, x.Rules)
	return RuleExplain{}
}

func TestExplainWinningRuleSharesLevelAndRecent(t *testing.T) {
	sh := &statusShares{}
	sh.set("key:acme", 0.25)
	r := newRig(t, explainRules, nil, func(c *Config) { c.Shares = sh })
	a := rules.Attrs{APIKey: "acme", Plan: "pro", IP: netip.MustParseAddr("192.0.2.1")}
	for range 30 { // 50 tokens at share 0.25: 200 × 0.25 = 50; 30 taken
		r.check(t, a)
	}
	x := explainOf(t, r, a, true)
	if len(x.Rules) != 2 || x.Rules[0].Rule != "pro" || x.Rules[1].Rule != "per-ip" || !x.Admin || x.RulesVersion == "" {
		t.Fatalf("rules %+v", x.Rules)
	}
	pro := ruleOf(t, x, "pro")
	// The winner and why: plan (4) beats the default (0); the key's override expired.
	if pro.Specificity != 4 || pro.Matched["plan"] != "pro" || len(pro.Beat) != 1 || pro.Beat[0].Rule != "default" ||
		len(pro.Expired) != 1 || pro.Expired[0] != "acme" || pro.Identity != "key:acme" {
		t.Fatalf("pro %+v", pro)
	}
	if pro.Why != "beats default: specificity 4 over 0 (api_key 16, org 8, plan 4, endpoint 2, ip 1)" {
		t.Fatalf("why %q", pro.Why)
	}
	// The share, its set and age, and each limit global and regional.
	if s := pro.Share; s.Value != 0.25 || s.Source != "balancer" || s.Default != 1 || s.Version != 42 || s.LeaderRev != 7 || s.AgeSeconds != 3 {
		t.Fatalf("share %+v", s)
	}
	sec := pro.Limits[0]
	if sec.Name != "pro/second" || sec.GlobalRate != 100 || sec.GlobalBurst != 200 || sec.Rate != 25 || sec.Burst != 50 {
		t.Fatalf("limit %+v", sec)
	}
	// The level: 50 − 30 taken, on the fake clock (no refill).
	if sec.Level == nil || *sec.Level != 20 {
		t.Fatalf("level %v (%s), want 20", sec.Level, sec.LevelError)
	}
	// Explaining took nothing.
	if x2 := explainOf(t, r, a, true); *ruleOf(t, x2, "pro").Limits[0].Level != 20 {
		t.Fatal("explain took tokens")
	}
	// The recent takes: 30, newest first, all allowed from the memory store.
	if len(pro.Recent) != 30 || !pro.Recent[0].Allowed || pro.Recent[0].Source != "memory" || pro.Recent[0].Rule != "pro" {
		t.Fatalf("recent %d %+v", len(pro.Recent), pro.Recent)
	}
	// A key without a balancer share: the default split, its level full.
	d := ruleOf(t, explainOf(t, r, rules.Attrs{APIKey: "other"}, true), "default")
	if d.Share.Source != "default" || d.Share.Value != 1 || *d.Limits[0].Level != 20 || len(d.Recent) != 0 || len(d.Matched) != 0 {
		t.Fatalf("default %+v", d)
	}
}

// The customer's view shows only buckets counted by their own key in full.
func TestExplainCustomerSeesOnlyOwnBuckets(t *testing.T) {
	r := newRig(t, explainRules, nil)
	a := rules.Attrs{APIKey: "k", IP: netip.MustParseAddr("192.0.2.9")}
	r.check(t, a)
	x := explainOf(t, r, a, false)
	own, ip := ruleOf(t, x, "default"), ruleOf(t, x, "per-ip")
	if own.Redacted || own.Limits[0].Level == nil || len(own.Recent) != 1 {
		t.Fatalf("own bucket %+v", own)
	}
	if !ip.Redacted || ip.Identity != "" || ip.Limits[0].Level != nil || len(ip.Recent) != 0 || ip.Share.Source != "" || ip.Limits[0].GlobalRate != 50 {
		t.Fatalf("shared bucket %+v", ip)
	}
}

// Recording recent takes is bounded: the ring keeps its size whatever the traffic.
func TestRecentIsBounded(t *testing.T) {
	r := newRig(t, explainRules, nil, func(c *Config) { c.RecentDecisions = 32 })
	a := rules.Attrs{APIKey: "hot"}
	for range 100 {
		r.check(t, a)
	}
	if n := len(r.e.recent.of("key:hot")); n != 2 { // 32 over 16 shards
		t.Fatalf("%d recent kept, want 2", n)
	}
	off := newRig(t, explainRules, nil, func(c *Config) { c.RecentDecisions = 0 })
	off.check(t, a)
	if ruleOf(t, explainOf(t, off, a, true), "default").Recent != nil {
		t.Fatal("recent kept with RecentDecisions 0")
	}
}
