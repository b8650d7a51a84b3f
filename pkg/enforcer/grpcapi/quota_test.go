package grpcapi

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/quota"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// quotaRules are calendar quotas of a day, a week and a month, as descriptor rules and
// as an allot.v1 rule.
const quotaRules = `
rules:
  - id: daily
    match: {domain: d, descriptor: [{key: day}]}
    limits: [{name: day, quota: 3, period: day}]
  - id: weekly
    match: {domain: d, descriptor: [{key: week}]}
    limits: [{name: week, quota: 70, period: week}]
  - id: monthly
    match: {domain: d, descriptor: [{key: month}]}
    limits: [{name: month, quota: 1000, period: month, time_zone: America/New_York}]
  - id: api
    match: {plan: pro}
    limits: [{name: day, quota: 2, period: day}]
`

func quotaRig(t *testing.T) *enforcertest.Rig {
	return enforcertest.New(t, quotaRules, func(c *enforcer.Config) {
		qc := quota.DefaultConfig()
		qc.Clock = c.Clock
		tb, err := quota.New(quota.NewMemory(), qc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tb.Close() })
		c.Quotas = tb
	})
}

// Envoy's answer states a calendar quota in its unit (DAY, WEEK, MONTH), what is left in
// the period and the time to the period's end.
func TestEnvoyRLSCalendarQuota(t *testing.T) {
	rig := quotaRig(t)
	s := New(rig.E, Config{})
	// enforcertest.Start is 2026-03-01 12:00 UTC, a Sunday.
	for _, tc := range []struct {
		key   string
		rpu   uint32
		unit  rlsv3.RateLimitResponse_RateLimit_Unit
		reset time.Duration
	}{
		{"day", 3, rlsv3.RateLimitResponse_RateLimit_DAY, 12 * time.Hour},
		{"week", 70, rlsv3.RateLimitResponse_RateLimit_WEEK, 12 * time.Hour},
		{"month", 1000, rlsv3.RateLimitResponse_RateLimit_MONTH, 31*24*time.Hour - 8*time.Hour}, // to April 1st 00:00 in New York (EDT): 04:00 UTC
	} {
		resp, err := s.ShouldRateLimit(context.Background(), rls("d", desc(tc.key, "a")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.CurrentLimit.GetRequestsPerUnit() != tc.rpu || st.CurrentLimit.GetUnit() != tc.unit ||
			st.LimitRemaining != tc.rpu-1 || st.DurationUntilReset.AsDuration() != tc.reset {
			t.Errorf("%s: %v, want %d per %v, %d left, reset in %v", tc.key, st, tc.rpu, tc.unit, tc.rpu-1, tc.reset)
		}
	}
	for range 2 {
		s.ShouldRateLimit(context.Background(), rls("d", desc("day", "a")))
	}
	resp, err := s.ShouldRateLimit(context.Background(), rls("d", desc("day", "a")))
	if err != nil || resp.OverallCode != over || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("4th of 3 a day: %v %v", resp, err)
	}
}

// allot.v1 carries the quota in its RateLimit fields: quota, window (a day), remaining
// and the reset at midnight.
func TestAllotCheckCalendarQuota(t *testing.T) {
	rig := quotaRig(t)
	cli := allotv1.NewAllotClient(serve(t, New(rig.E, Config{})))
	ctx := context.Background()
	resp, err := cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k", Plan: "pro"})
	if err != nil || !resp.GetAllowed() || resp.GetLimit() != "api/day" || resp.GetQuota() != 2 || resp.GetWindowSeconds() != 86400 ||
		resp.GetRemaining() != 1 || resp.GetResetMs() != (12*time.Hour).Milliseconds() {
		t.Fatalf("Check: %v %v", resp, err)
	}
	cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k", Plan: "pro"})
	resp, err = cli.Check(ctx, &allotv1.CheckRequest{ApiKey: "k", Plan: "pro"})
	if err != nil || resp.GetAllowed() || resp.GetRemaining() != 0 || resp.GetRetryAfterMs() != (12*time.Hour).Milliseconds() {
		t.Fatalf("3rd of 2: %v %v", resp, err)
	}
	var policy string
	for _, h := range resp.GetHeaders() {
		if h.GetName() == enforcer.HeaderRateLimitPolicy {
			policy = h.GetValue()
		}
	}
	if policy != `"api/day";q=2;w=86400` {
		t.Fatalf("RateLimit-Policy %q", policy)
	}
}
