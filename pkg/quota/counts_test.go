package quota

import (
	"testing"

	"github.com/allot-dev/allot/pkg/clock"
)

// Counts: what the usage reports carry — each quota in its current period with the
// quota in force and this enforcer's count (known + its own not yet sent), the quotas
// with the least left first when the report has room for fewer.
func TestCountsForTheReports(t *testing.T) {
	clk := clock.NewFake(t0)
	tb := newTable(t, NewMemory(), clk)
	q := daily(10)
	for range 7 {
		reserve(t, tb, "key:a", q, 1, clk.Now())
	}
	reserve(t, tb, "key:b", q, 2, clk.Now())
	all := tb.Counts(clk.Now(), 10)
	if len(all) != 2 {
		t.Fatalf("%d counts, want 2: %v", len(all), all)
	}
	one := tb.Counts(clk.Now(), 1)
	if len(one) != 1 || one[0].Identity != "key:a" || one[0].Count != 7 || one[0].Quota != 10 || one[0].Name != "r/daily" {
		t.Fatalf("room for one: %v, want key:a at 7 of 10 (the least left)", one)
	}
	if start, _ := q.Bounds(clk.Now()); !one[0].Start.Equal(start) {
		t.Fatalf("period start %v, want %v", one[0].Start, start)
	}
	if got := tb.Counts(clk.Now(), 0); got != nil {
		t.Fatalf("room for none: %v", got)
	}
	clk.Advance(24 * 3600e9) // the next day: last period's entries are not reported
	if got := tb.Counts(clk.Now(), 10); len(got) != 0 {
		t.Fatalf("the next period: %v, want none", got)
	}
}
