package enforcer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
)

// quotaRig is a rig whose enforcer counts calendar quotas in a table over m, on the
// rig's fake clock.
func quotaRig(t *testing.T, yaml string, m quota.Counter) (*rig, *quota.Table) {
	t.Helper()
	var tb *quota.Table
	r := newRig(t, yaml, nil, func(c *Config) {
		qc := quota.DefaultConfig()
		qc.Clock = c.Clock
		var err error
		if tb, err = quota.New(m, qc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tb.Close() })
		c.Quotas = tb
	})
	return r, tb
}

const dailyQuota = `
rules:
  - id: search
    limits:
      - {name: second, rate: 1000, per: 1s}
      - {name: daily, quota: 5, period: day, time_zone: Europe/Paris}
`

// A quota admits up to its count in the period and refuses after, stating itself in the
// RateLimit fields: the quota, what is left, and the reset at the calendar boundary
// (midnight in Paris); the checks cost no counter call but the key's first.
func TestQuotaCheck(t *testing.T) {
	m := quota.NewMemory()
	r, tb := quotaRig(t, dailyQuota, m)
	a := rules.Attrs{APIKey: "k"}
	untilMidnight := time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC).Sub(t0) // Paris is UTC+1 in March
	for i := range 5 {
		d := r.check(t, a)
		if !d.Allowed {
			t.Fatalf("check %d refused: %+v", i, d)
		}
		if i == 4 && (d.Limit != "search/daily" || d.Remaining != 0 || d.Quota != 5) {
			t.Fatalf("the 5th is decided by the quota with nothing left: %+v", d)
		}
	}
	d := r.check(t, a)
	if d.Allowed || d.Limit != "search/daily" || d.Quota != 5 || d.Window != 86400 || d.Remaining != 0 ||
		d.Reset != untilMidnight || d.RetryAfter != untilMidnight || d.Source != SourceLease {
		t.Fatalf("6th: %+v, want refused by search/daily, reset in %v", d, untilMidnight)
	}
	h := d.AppendHeaders(nil)
	if h[0].Value != `"search/daily";q=5;w=86400` || !strings.HasPrefix(h[1].Value, `"search/daily";r=0;t=39600`) {
		t.Fatalf("headers %+v", h)
	}
	if m.Batches() != 1 {
		t.Fatalf("%d counter calls for 6 checks, want 1 (the first read)", m.Batches())
	}
	tb.Flush(context.Background())
	start := time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC)
	if got := m.Get("key:k", "search/daily", start); got != 5 {
		t.Fatalf("counter %d, want the 5 admitted", got)
	}
	// Explain shows the use in the period.
	x, err := r.e.Explain(context.Background(), &Request{Attrs: a}, true)
	if err != nil {
		t.Fatal(err)
	}
	q := x.Rules[0].Quotas
	if len(q) != 1 || q[0].Used != 5 || q[0].Remaining != 0 || q[0].Quota != 5 || q[0].Period != "day" ||
		q[0].TimeZone != "Europe/Paris" || !q[0].Reset.Equal(t0.Add(untilMidnight)) || !q[0].Start.Equal(start) || !q[0].Synced {
		t.Fatalf("explain: %+v", q)
	}
	// A new day in Paris: the quota is whole again.
	r.clk.Advance(untilMidnight)
	if d := r.check(t, a); !d.Allowed || d.Limit != "search/daily" || d.Remaining != 4 {
		t.Fatalf("after midnight: %+v", d)
	}
}

// A check refused by the rule's bucket, or by a later rule, is not counted.
func TestQuotaRefusalsNotCounted(t *testing.T) {
	m := quota.NewMemory()
	r, tb := quotaRig(t, `
rules:
  - id: key
    limits:
      - {name: second, rate: 2, per: 1s}
      - {name: daily, quota: 100, period: day}
  - id: endpoint
    by: endpoint
    limits: [{name: second, rate: 3, per: 1s}]
`, m)
	allowed := 0
	for range 5 {
		if d := r.check(t, rules.Attrs{APIKey: "a", Endpoint: "GET /x"}); d.Allowed {
			allowed++
		}
	}
	// key b: the per-key bucket grants 2, the shared endpoint bucket holds 1 more.
	for range 3 {
		if d := r.check(t, rules.Attrs{APIKey: "b", Endpoint: "GET /x"}); d.Allowed {
			allowed++
		}
	}
	tb.Flush(context.Background())
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	a, b := m.Get("key:a", "key/daily", start), m.Get("key:b", "key/daily", start)
	if allowed != 3 || a != 2 || b != 1 {
		t.Fatalf("allowed %d; counted a %d, b %d; want 3 allowed, 2 and 1 counted", allowed, a, b)
	}
}

// Raising a quota mid-period admits at once; lowering it below the use refuses at once.
func TestQuotaRaisedMidPeriod(t *testing.T) {
	r, _ := quotaRig(t, strings.ReplaceAll(dailyQuota, "quota: 5", "quota: 3"), quota.NewMemory())
	a := rules.Attrs{APIKey: "k"}
	for range 3 {
		r.check(t, a)
	}
	if d := r.check(t, a); d.Allowed {
		t.Fatal("4th of 3 admitted")
	}
	r.h.Store(compile(t, dailyQuota, t0)) // 3 → 5
	for i := range 2 {
		if d := r.check(t, a); !d.Allowed || d.Quota != 5 {
			t.Fatalf("raised to 5: check %d: %+v", i, d)
		}
	}
	if d := r.check(t, a); d.Allowed {
		t.Fatal("6th of 5 admitted")
	}
	r.h.Store(compile(t, strings.ReplaceAll(dailyQuota, "quota: 5", "quota: 2"), t0))
	if d := r.check(t, a); d.Allowed || d.Remaining != 0 || d.Quota != 2 {
		t.Fatalf("lowered to 2 under a use of 5: %+v", d)
	}
}

// While the counter does not answer, a fail-closed quota refuses and a fail-open one
// counts locally; a quota-only rule needs no bucket.
func TestQuotaOutage(t *testing.T) {
	m := quota.NewMemory()
	r, tb := quotaRig(t, `
rules:
  - id: closed
    match: {plan: closed}
    fail_mode: closed
    limits: [{name: month, quota: 10, period: month}]
  - id: open
    limits: [{name: week, quota: 10, period: week}]
`, m)
	closed, open := rules.Attrs{APIKey: "k", Plan: "closed"}, rules.Attrs{APIKey: "k"}
	if d := r.check(t, closed); !d.Allowed || d.Window != 30*86400 || d.Remaining != 9 {
		t.Fatalf("month quota: %+v", d)
	}
	if d := r.check(t, open); !d.Allowed || d.Window != 7*86400 {
		t.Fatalf("week quota: %+v", d)
	}
	m.Fail(errors.New("down"))
	r.check(t, closed)
	tb.Flush(context.Background())
	d := r.check(t, closed)
	if d.Allowed || d.Source != SourceFailClosed || d.RetryAfter != 2*time.Second {
		t.Fatalf("fail-closed during the outage: %+v", d)
	}
	if d := r.check(t, open); !d.Allowed || d.Source != SourceFallback && d.Source != SourceLease {
		t.Fatalf("fail-open during the outage: %+v", d)
	}
	m.Fail(nil)
	tb.Flush(context.Background())
	if d := r.check(t, closed); !d.Allowed || d.Source != SourceLease || d.Remaining != 7 {
		t.Fatalf("after the outage: %+v (the refusal not counted)", d)
	}
}

// Without a quota table a quota answers by the rule's fail mode.
func TestQuotaWithoutTable(t *testing.T) {
	r := newRig(t, `
rules:
  - id: q
    fail_mode: closed
    limits: [{name: day, quota: 10, period: day}]
`, nil, func(c *Config) { c.Clock = clock.NewFake(t0) })
	if d := r.check(t, rules.Attrs{APIKey: "k"}); d.Allowed || d.Source != SourceFailClosed {
		t.Fatalf("%+v", d)
	}
}
