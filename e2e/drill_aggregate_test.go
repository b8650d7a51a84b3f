package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
)

// TestAggregatedDrills is the three-region balancer stack of TestBalancerDrills with the
// report aggregation tier on (issue 26 §3, docs/design.md §12): a report aggregator per
// region (bin/balancer with an aggregate section) between the region's enforcers and
// the balancer leader, reaching etcd and the replicas through the region's links. The
// traffic-shift, leader-killed, region-cut and region-down drills must pass as on the
// direct path — region-cut with the aggregator cut off and the region's enforcers still
// reporting to it, so they fence themselves by what the leader last confirmed hearing
// (ReportResponse.heard_ago_ms) — no share set published in etcd may sum above 1, and
// every aggregator must have forwarded.
func TestAggregatedDrills(t *testing.T) {
	began := time.Now()
	opt := stack.DefaultOptions()
	opt.Balancers = 2
	opt.Aggregate = true
	opt.BalanceInterval = 2 * time.Second
	opt.SessionTTL = 4 * time.Second
	opt.ShareStale = 12 * time.Second
	s := stack.Start(t, opt)
	t.Logf("aggregated drills: stack up in %v", time.Since(began).Round(time.Millisecond))

	sums := watchShareSums(t, s)
	t.Run("traffic-shift", func(t *testing.T) { drillTrafficShift(t, s) })
	t.Run("leader-killed", func(t *testing.T) { drillLeaderKilled(t, s) })
	t.Run("region-cut", func(t *testing.T) { drillRegionCut(t, s, sums) })
	t.Run("region-down", func(t *testing.T) { drillRegionDown(t, s, sums) })
	n, worst := sums.stop()
	t.Logf("share sets read from etcd during the drills: %d, largest sum over regions %.4f; every version seen:%s", n, worst, sums.History())
	if worst > 1+1e-9 {
		t.Errorf("a published share vector summed to %.6f > 1", worst)
	}
	for _, a := range s.Aggregators {
		m, err := a.Metrics(context.Background())
		if err != nil {
			t.Fatalf("aggregator %s: %v", a.ID, err)
		}
		acc, elected := m.Sum("allot_aggregator_forwards_total", `result="accepted"`), m.Sum("allot_aggregator_elected")
		t.Logf("aggregator %s: elected %v, forwards accepted %v, reports %v", a.ID, elected, acc, m.Labels("allot_aggregator_reports_total", "result"))
		if elected != 1 || acc == 0 {
			t.Errorf("aggregator %s: elected %v, %v forwards accepted; want elected and forwarding", a.ID, elected, acc)
		}
	}
	t.Logf("aggregated drills: all done in %v", time.Since(began).Round(time.Millisecond))
}
