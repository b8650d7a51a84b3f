package enforcer

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// TestCheckStatsExposition: the striped metrics scrape as the Prometheus histogram and
// counter vector they replace would, for the same checks.
func TestCheckStatsExposition(t *testing.T) {
	var c checkStats
	ref := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "allot_enforcer_check_seconds", Help: latencyHelp, Buckets: latencyBuckets[:],
	})
	for i, took := range []time.Duration{0, 10 * time.Microsecond, 25 * time.Microsecond, 26 * time.Microsecond, time.Millisecond, 3 * time.Second} {
		for range i + 1 {
			c.observe(i%2, SourceLease, took)
			ref.Observe(took.Seconds())
		}
	}
	c.observe(1, SourceShadow, time.Microsecond) // counted as none
	ref.Observe(time.Microsecond.Seconds())

	got, want := gather(t, &c), gather(t, ref)
	gh, wh := got["allot_enforcer_check_seconds"].GetMetric()[0].GetHistogram(), want["allot_enforcer_check_seconds"].GetMetric()[0].GetHistogram()
	if gh.GetSampleCount() != wh.GetSampleCount() || math.Abs(gh.GetSampleSum()-wh.GetSampleSum()) > 1e-9 {
		t.Errorf("count %d sum %g, want %d %g", gh.GetSampleCount(), gh.GetSampleSum(), wh.GetSampleCount(), wh.GetSampleSum())
	}
	if len(gh.GetBucket()) != len(wh.GetBucket()) {
		t.Fatalf("%d buckets, want %d", len(gh.GetBucket()), len(wh.GetBucket()))
	}
	for i, b := range wh.GetBucket() {
		if g := gh.GetBucket()[i]; g.GetUpperBound() != b.GetUpperBound() || g.GetCumulativeCount() != b.GetCumulativeCount() {
			t.Errorf("bucket %d: le %g count %d, want le %g count %d", i, g.GetUpperBound(), g.GetCumulativeCount(), b.GetUpperBound(), b.GetCumulativeCount())
		}
	}

	wantDecisions := map[[2]string]float64{{"allowed", "lease"}: 12, {"refused", "lease"}: 9, {"allowed", "none"}: 1}
	ms := got["allot_enforcer_decisions_total"].GetMetric()
	if len(ms) != 2*(int(numSources)-1) { // every (result, source) series, as the counter vector had
		t.Errorf("%d decision series, want %d", len(ms), 2*(int(numSources)-1))
	}
	for _, m := range ms {
		var k [2]string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "result":
				k[0] = l.GetValue()
			case "source":
				k[1] = l.GetValue()
			}
		}
		if v := m.GetCounter().GetValue(); v != wantDecisions[k] {
			t.Errorf("decisions %v = %g, want %g", k, v, wantDecisions[k])
		}
	}
}
