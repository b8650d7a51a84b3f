package report

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var qPeriod = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

func qcount(identity string, quota, count int64) *allotv1.QuotaCount {
	return &allotv1.QuotaCount{Rule: "r", Limit: "daily", Identity: identity, PeriodStartMs: qPeriod, Quota: quota, Count: count}
}

func answer(rev int64, frac float64, others ...*allotv1.QuotaCount) *allotv1.ReportResponse {
	return &allotv1.ReportResponse{Accepted: true, LeaderRev: rev, QuotaAnswered: true, QuotaOthers: others, QuotaIsolatedFraction: frac}
}

// TestQuotaViewStep: the others' count as answered, never lowered by a new leader, not
// taken when not asked, and after Stale without an answer the count that holds the region
// to its count then plus its fraction of what was left — what the balancer counts a
// silent region at (pkg/balancer TestQuotaOthersStep).
func TestQuotaViewStep(t *testing.T) {
	v := NewQuotaView(20*time.Second, 10)
	k := QuotaKey{"r", "daily", "k_1", qPeriod}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	if got := v.Others(at(0), k); got != 0 {
		t.Fatalf("never answered: %d, want 0", got)
	}
	sent := []*allotv1.QuotaCount{qcount("k_1", 1000, 100)}
	v.Answered(at(1), sent, answer(7, 1.0/3, qcount("k_1", 1000, 300), qcount("k_2", 1000, 999)))
	if got := v.Others(at(2), k); got != 300 {
		t.Fatalf("answered 300: %d", got)
	}
	if got := v.Others(at(2), QuotaKey{"r", "daily", "k_2", qPeriod}); got != 0 {
		t.Fatalf("an answer for a quota not asked was believed: %d", got)
	}
	// Within a term the answer is taken as it is (a silent region's reservation may give way
	// to its real, smaller count).
	v.Answered(at(11), sent, answer(7, 1.0/3, qcount("k_1", 1000, 280)))
	if got := v.Others(at(12), k); got != 280 {
		t.Fatalf("same term, 280 answered: %d", got)
	}
	// A new leader never lowers it.
	v.Answered(at(21), sent, answer(8, 1.0/3, qcount("k_1", 1000, 50)))
	if got := v.Others(at(22), k); got != 280 {
		t.Fatalf("a new term's 50 lowered 280: %d", got)
	}
	v.Answered(at(31), sent, answer(8, 1.0/3, qcount("k_1", 1000, 310)))
	if got := v.Others(at(32), k); got != 310 {
		t.Fatalf("new term's 310: %d", got)
	}
	// An answer that says it is not answering (a leader warming up) changes nothing, and
	// does not count as heard.
	v.Answered(at(40), sent, &allotv1.ReportResponse{Accepted: true, LeaderRev: 9})
	if got := v.Others(at(51), k); got != 310 {
		t.Fatalf("20 s after the last answer: %d, want 310", got)
	}
	// More than Stale without an answer: held at own₀ + ⌊(1000 − 100 − 310)/3⌋ = 100 + 196.
	if got := v.Others(at(52), k); got != 1000-(100+196) {
		t.Fatalf("held: others %d, want %d (own may reach 296)", got, 1000-(100+196))
	}
	if !v.Held(at(52)) {
		t.Fatal("Held false after Stale without an answer")
	}
}

func TestQuotaViewBounded(t *testing.T) {
	v := NewQuotaView(time.Minute, 2)
	sent := []*allotv1.QuotaCount{qcount("a", 10, 1), qcount("b", 10, 1), qcount("c", 10, 1)}
	v.Answered(t0, sent, answer(1, 0.5, qcount("a", 10, 5), qcount("b", 10, 5), qcount("c", 10, 5)))
	if got := v.Others(t0, QuotaKey{"r", "daily", "c", qPeriod}); got != 0 {
		t.Fatalf("a third quota kept past the bound of 2: %d", got)
	}
	// The next period's quotas push out the last period's.
	next := qcount("a", 10, 1)
	next.PeriodStartMs += 86_400_000
	o := qcount("a", 10, 4)
	o.PeriodStartMs = next.PeriodStartMs
	v.Answered(t0, []*allotv1.QuotaCount{next}, answer(1, 0.5, o))
	if got := v.Others(t0, QuotaKey{"r", "daily", "a", next.PeriodStartMs}); got != 4 {
		t.Fatalf("the new period's quota: %d, want 4", got)
	}
}

type fixedCounts []*allotv1.QuotaCount

func (f fixedCounts) QuotaCounts(time.Time, int) []*allotv1.QuotaCount { return f }

// TestReporterCarriesQuotas: the counts go out with the report and the answer reaches the
// view.
func TestReporterCarriesQuotas(t *testing.T) {
	b := startBalancer(t, true, "")
	b.others = 40
	v := NewQuotaView(time.Minute, 10)
	g := newRig(t, StaticLeader(b.addr), func(c *ReporterConfig) {
		c.Quotas, c.QuotaView = fixedCounts{qcount("k_1", 100, 7)}, v
	})
	g.tick(t, 10*time.Second)
	k := QuotaKey{"r", "daily", "k_1", qPeriod}
	poll.True(t, 10*time.Second, "the answer in the view", func() bool { return v.Others(g.clk.Now(), k) == 40 })
	if got := b.reports()[0].Quotas; len(got) != 1 || got[0].Count != 7 {
		t.Fatalf("report carried %v", got)
	}
}
