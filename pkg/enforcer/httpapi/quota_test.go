package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/hashicorp/go-hclog"
)

// POST /v1/check answers a calendar quota's budget: the quota, a day's window, what is
// left and the reset at the next midnight (enforcertest.Start is 12:00 UTC).
func TestCheckCalendarQuota(t *testing.T) {
	rig := enforcertest.New(t, "rules:\n  - id: api\n    limits: [{name: day, quota: 2, period: day}]\n", func(c *enforcer.Config) {
		qc := quota.DefaultConfig()
		qc.Clock = c.Clock
		tb, err := quota.New(quota.NewMemory(), qc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tb.Close() })
		c.Quotas = tb
	})
	srv := httptest.NewServer(Handler(rig.E, Config{}, rig.Reg, nil, hclog.NewNullLogger()))
	t.Cleanup(srv.Close)
	twelveHours := (12 * time.Hour).Milliseconds()
	for i, want := range []CheckResponse{
		{Allowed: true, Rule: "api", Limit: "api/day", Quota: 2, WindowSeconds: 86400, Remaining: 1, ResetMs: twelveHours, Source: "lease", CountedBy: "api_key"},
		{Allowed: true, Rule: "api", Limit: "api/day", Quota: 2, WindowSeconds: 86400, Remaining: 0, ResetMs: twelveHours, Source: "lease", CountedBy: "api_key"},
		{Allowed: false, Rule: "api", Limit: "api/day", Quota: 2, WindowSeconds: 86400, Remaining: 0, ResetMs: twelveHours, RetryAfterMs: twelveHours, Source: "lease", CountedBy: "api_key"},
	} {
		code, b := postTo(t, srv.URL+"/v1/check", `{"api_key":"k"}`)
		var got CheckResponse
		if err := json.Unmarshal(b, &got); err != nil || got.Allowed != want.Allowed || got.Limit != want.Limit || got.Quota != want.Quota ||
			got.WindowSeconds != want.WindowSeconds || got.Remaining != want.Remaining || got.ResetMs != want.ResetMs ||
			got.RetryAfterMs != want.RetryAfterMs || got.Source != want.Source {
			t.Fatalf("check %d: %d %s, want %+v", i, code, b, want)
		}
	}
}
