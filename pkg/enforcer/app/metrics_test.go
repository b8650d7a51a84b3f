package app

import (
	"testing"

	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFallbackLocalAnswers: local answers are counted by shard and reason, a reason out of
// range is dropped, and a shard's counters, once made, cost no allocation per check (an
// outage answers every check of the shard locally).
func TestFallbackLocalAnswers(t *testing.T) {
	m := newFallbackMetrics(prometheus.NewRegistry())
	m.Local("10.0.0.1:6379", fallback.LocalWait)
	m.Local("10.0.0.1:6379", fallback.LocalWait)
	m.Local("10.0.0.2:6379", fallback.LocalOpen)
	m.Local("10.0.0.2:6379", fallback.NumLocalReasons)
	for _, c := range []struct {
		shard, why string
		want       float64
	}{
		{"10.0.0.1:6379", "wait", 2}, {"10.0.0.1:6379", "open", 0}, {"10.0.0.2:6379", "open", 1}, {"10.0.0.2:6379", "error", 0},
	} {
		if got := testutil.ToFloat64(m.local.WithLabelValues(c.shard, c.why)); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.shard, c.why, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.local); n != 2*int(fallback.NumLocalReasons) {
		t.Errorf("%d series, want every reason of the two shards seen (%d)", n, 2*fallback.NumLocalReasons)
	}
	if a := testing.AllocsPerRun(100, func() { m.Local("10.0.0.2:6379", fallback.LocalOpen) }); a != 0 {
		t.Errorf("%v allocations per local answer, want 0", a)
	}
}
