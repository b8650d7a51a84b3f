package balancer

import (
	"errors"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var period = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

func qc(identity string, quota, count int64) *allotv1.QuotaCount {
	return &allotv1.QuotaCount{Rule: "default", Limit: "daily", Identity: identity, PeriodStartMs: period, Quota: quota, Count: count}
}

func quotaReport(region string, seq uint64, at time.Time, qs ...*allotv1.QuotaCount) *allotv1.ReportRequest {
	r := report(region, region+"-1", seq, at)
	r.Quotas = qs
	return r
}

// others sends region's report through Ingest and Quotas, as the Service does, and returns
// the answered count of identity k_1 (-1 when not answered).
func others(t *testing.T, c *Core, region string, seq uint64, at time.Time, q *allotv1.QuotaCount) int64 {
	t.Helper()
	r := quotaReport(region, seq, at, q)
	if err := c.Ingest(at, r); err != nil {
		t.Fatal(err)
	}
	resp := &allotv1.ReportResponse{}
	c.Quotas(at, r, resp)
	if !resp.QuotaAnswered {
		return -1
	}
	out := resp.QuotaOthers
	if len(out) != 1 {
		t.Fatalf("%d answers for one quota", len(out))
	}
	return out[0].Count
}

// TestQuotaOthersStep walks one quota of 1,000 a day over three regions through a term:
// the warm-up answers nothing until every region has reported, then each region hears the others' largest counts, and a
// region that falls silent is counted at its count plus its third of what it was last told
// was left — exactly what it holds itself to (report.QuotaView).
func TestQuotaOthersStep(t *testing.T) {
	c := newTestCore(t, nil) // regions3, SilentAfter 20 s, equal weights
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []struct {
		s      int
		region string
		count  int64
		want   int64 // the others' count answered; -1: not answered
	}{
		{0, "us-east", 100, -1},   // warm-up: a new term answers nothing
		{10, "eu-west", 200, -1},  // still warming up
		{15, "ap-south", 50, 300}, // every region heard: answered before SilentAfter
		{21, "us-east", 120, 250},
		{22, "eu-west", 180, 170}, // a smaller count is an older read: the largest stands
		{30, "us-east", 150, 250}, // 200 + 50
		{32, "eu-west", 260, 200}, // 150 + 50
		{35, "us-east", 160, 310}, // 260 + 50
		// ap-south, heard at 15 s, is silent after 35 s: counted at 50 + ⌈(1000 − 50 −
		// 300)/3⌉ = 50 + 217, its third of what was left when it was last told 300.
		{41, "eu-west", 270, 160 + 50 + 217},
		{45, "us-east", 170, 270 + 50 + 217},
	}
	seq := map[string]uint64{}
	for _, st := range steps {
		seq[st.region]++
		got := others(t, c, st.region, seq[st.region], at(st.s), qc("k_1", 1000, st.count))
		if got != st.want {
			t.Fatalf("at %ds %s (count %d): others %d, want %d", st.s, st.region, st.count, got, st.want)
		}
	}
	// ap-south is back: its real count again.
	seq["ap-south"]++
	if got := others(t, c, "ap-south", seq["ap-south"], at(50), qc("k_1", 1000, 60)); got != 170+270 {
		t.Fatalf("ap-south back: others %d, want %d", got, 170+270)
	}
	seq["us-east"]++
	if got := others(t, c, "us-east", seq["us-east"], at(51), qc("k_1", 1000, 170)); got != 270+60 {
		t.Fatalf("after ap-south is back: us-east hears %d, want %d", got, 270+60)
	}
}

func TestQuotaPeriodsAndRulesApart(t *testing.T) {
	c := newTestCore(t, nil)
	at := t0.Add(30 * time.Second)
	c.Quotas(t0, quotaReport("us-east", 1, t0), &allotv1.ReportResponse{}) // start the term
	next := qc("k_1", 1000, 7)
	next.PeriodStartMs += 24 * 3600 * 1000
	other := qc("k_1", 1000, 9)
	other.Limit = "monthly"
	r := quotaReport("eu-west", 1, at, qc("k_1", 1000, 500), next, other)
	c.Quotas(at, r, &allotv1.ReportResponse{})
	c.Quotas(at, quotaReport("ap-south", 1, at), &allotv1.ReportResponse{}) // heard: not counted at a reservation
	r2 := quotaReport("us-east", 2, at, qc("k_1", 1000, 1), next, other)
	resp := &allotv1.ReportResponse{}
	c.Quotas(at, r2, resp)
	out, ok, frac := resp.QuotaOthers, resp.QuotaAnswered, resp.QuotaIsolatedFraction
	if !ok || len(out) != 3 {
		t.Fatalf("answered %v, %d answers", ok, len(out))
	}
	if out[0].Count != 500 || out[1].Count != 7 || out[2].Count != 9 {
		t.Fatalf("others %d %d %d, want 500 7 9: a period or a limit leaked into another", out[0].Count, out[1].Count, out[2].Count)
	}
	if frac < 0.333 || frac > 0.334 || resp.QuotaHoldAfterMs != 20_000 {
		t.Fatalf("isolated fraction %g, hold after %d ms; want a third and SilentAfter", frac, resp.QuotaHoldAfterMs)
	}
}

func TestQuotaBookBounded(t *testing.T) {
	c := newTestCore(t, func(cfg *CoreConfig) { cfg.MaxQuotaEntries = 2 })
	at := t0.Add(30 * time.Second)
	c.Quotas(t0, quotaReport("us-east", 1, t0), &allotv1.ReportResponse{})
	resp := &allotv1.ReportResponse{}
	c.Quotas(at, quotaReport("us-east", 2, at, qc("a", 10, 1), qc("b", 10, 1), qc("c", 10, 1)), resp)
	out, ok := resp.QuotaOthers, resp.QuotaAnswered
	if !ok || len(out) != 2 {
		t.Fatalf("a full book answered %d of 3 (ok %v), want the 2 it holds", len(out), ok)
	}
	if s := c.Stats(at); s.Quotas != 2 || s.QuotaRefused != 1 {
		t.Fatalf("stats: %d quotas, %d refused; want 2, 1", s.Quotas, s.QuotaRefused)
	}
	// An hour later the quotas nobody named are forgotten and a new one is taken.
	later := at.Add(quotaForget + time.Minute)
	resp = &allotv1.ReportResponse{}
	c.Quotas(later, quotaReport("us-east", 3, later, qc("c", 10, 1)), resp)
	out = resp.QuotaOthers
	if len(out) != 1 {
		t.Fatalf("after an hour: %d answers, want 1", len(out))
	}
	if s := c.Stats(later); s.Quotas != 1 {
		t.Fatalf("after an hour: %d quotas held, want 1", s.Quotas)
	}
}

func TestQuotaCountsValidated(t *testing.T) {
	c := newTestCore(t, nil)
	for _, q := range []*allotv1.QuotaCount{
		nil,
		{Rule: "default", Limit: "", Identity: "k", PeriodStartMs: period, Quota: 1},
		{Rule: "default", Limit: "daily", Identity: "k", PeriodStartMs: 0, Quota: 1},
		{Rule: "default", Limit: "daily", Identity: "k", PeriodStartMs: period, Quota: -1},
		{Rule: "default", Limit: "daily", Identity: "k", PeriodStartMs: period, Quota: 1, Count: -5},
	} {
		err := c.Ingest(t0, quotaReport("us-east", 1, t0, q))
		if !errors.Is(err, ErrInvalidReport) {
			t.Errorf("quota %v: err %v, want ErrInvalidReport", q, err)
		}
	}
}
