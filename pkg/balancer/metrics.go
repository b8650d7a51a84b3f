package balancer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the service's Prometheus series (names allot_balancer_*). Per-region labels
// only take the configured regions (and "unknown"), so label sets stay bounded.
type metrics struct {
	leader      prometheus.Gauge
	term        prometheus.Gauge
	reports     *prometheus.CounterVec // region, result
	lag         *prometheus.HistogramVec
	recompute   prometheus.Histogram
	writeBytes  *prometheus.CounterVec // kind: chunk, head
	writes      *prometheus.CounterVec // kind, result: ok, error, fenced
	transitions *prometheus.CounterVec // to: leader, standby
}

func newMetrics(reg prometheus.Registerer, s *Service) *metrics {
	m := &metrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "allot_balancer_leader",
			Help: "1 while this replica leads (its shares are the ones published), 0 while it stands by."}),
		term: prometheus.NewGauge(prometheus.GaugeOpts{Name: "allot_balancer_election_term",
			Help: "The election revision (fencing token) of this replica's current term as leader; 0 while standing by."}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_balancer_reports_total",
			Help: "Usage reports received, by region and result: accepted, invalid, redirected (answered by a standby), forbidden (no client certificate naming the report's region)."}, []string{"region", "result"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "allot_balancer_report_lag_seconds",
			Help:    "Arrival of an accepted report minus the end of the interval it covers, by region.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}}, []string{"region"}),
		recompute: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "allot_balancer_recompute_seconds",
			Help:    "Wall time of a Tick that recomputed every identity's shares.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}),
		writeBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_balancer_etcd_write_bytes_total",
			Help: "Bytes of share sets written to etcd (values only), by kind: chunk, head."}, []string{"kind"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_balancer_etcd_writes_total",
			Help: "Fenced etcd transactions by kind (chunk, head, delete) and result: ok, error, fenced (refused: no longer leader)."}, []string{"kind", "result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_balancer_leadership_changes_total",
			Help: "Times this replica became leader or stepped down."}, []string{"to"}),
	}
	reg.MustRegister(m.leader, m.term, m.reports, m.lag, m.recompute, m.writeBytes, m.writes, m.transitions, coreCollector{s})
	return m
}

var (
	shareAgeDesc = prometheus.NewDesc("allot_balancer_share_age_seconds",
		"How old the share set each region is known to apply is (see RegionStats.ShareAge); leader only.", []string{"region"}, nil)
	driftSumDesc = prometheus.NewDesc("allot_balancer_share_drift_sum",
		"Σ over identities of |published share − demand fraction| at the last recompute, by region; leader only.", []string{"region"}, nil)
	driftMaxDesc = prometheus.NewDesc("allot_balancer_share_drift_max",
		"max over identities of |published share − demand fraction| at the last recompute, by region; leader only.", []string{"region"}, nil)
	fencedDesc = prometheus.NewDesc("allot_balancer_region_fenced",
		"1 while an enforcer of the region has fenced itself (cut off from the control plane, still serving as far as the leader knows) and the region keeps its default share reserved for it, else 0; leader only.", []string{"region"}, nil)
	identitiesDesc = prometheus.NewDesc("allot_balancer_identities",
		"Identities tracked, listed in the published set (differ from the default split), and pending (change plan not finished); leader only.", []string{"state"}, nil)
	versionDesc = prometheus.NewDesc("allot_balancer_share_version",
		"Version of the share set last published by this leader.", nil, nil)
	ignoredDesc = prometheus.NewDesc("allot_balancer_ignored_total",
		"Report contents ignored in this term, by reason: duplicate (retried report), unknown_rule, dropped (identity cap), admitted_above_limits (the part of an admitted count above what the rule's limits allow, not believed).", []string{"reason"}, nil)
)

// coreCollector reads the leader's core at scrape time.
type coreCollector struct{ s *Service }

func (c coreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{shareAgeDesc, driftSumDesc, driftMaxDesc, fencedDesc, identitiesDesc, versionDesc, ignoredDesc} {
		ch <- d
	}
}

func (c coreCollector) Collect(ch chan<- prometheus.Metric) {
	core := c.s.currentCore()
	if core == nil {
		return
	}
	st := core.Stats(c.s.cfg.Clock.Now())
	for _, r := range st.Regions {
		ch <- prometheus.MustNewConstMetric(shareAgeDesc, prometheus.GaugeValue, r.ShareAge.Seconds(), r.Region)
		ch <- prometheus.MustNewConstMetric(driftSumDesc, prometheus.GaugeValue, r.DriftSum, r.Region)
		ch <- prometheus.MustNewConstMetric(driftMaxDesc, prometheus.GaugeValue, r.DriftMax, r.Region)
		ch <- prometheus.MustNewConstMetric(fencedDesc, prometheus.GaugeValue, b2f(r.Fenced), r.Region)
	}
	ch <- prometheus.MustNewConstMetric(identitiesDesc, prometheus.GaugeValue, float64(st.Tracked), "tracked")
	ch <- prometheus.MustNewConstMetric(identitiesDesc, prometheus.GaugeValue, float64(st.Listed), "listed")
	ch <- prometheus.MustNewConstMetric(identitiesDesc, prometheus.GaugeValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, float64(st.Version))
	ch <- prometheus.MustNewConstMetric(ignoredDesc, prometheus.CounterValue, float64(st.Duplicates), "duplicate")
	ch <- prometheus.MustNewConstMetric(ignoredDesc, prometheus.CounterValue, float64(st.UnknownRule), "unknown_rule")
	ch <- prometheus.MustNewConstMetric(ignoredDesc, prometheus.CounterValue, float64(st.Dropped), "dropped")
	ch <- prometheus.MustNewConstMetric(ignoredDesc, prometheus.CounterValue, float64(st.Clamped), "admitted_above_limits")
}

func (m *metrics) setLeader(rev int64) {
	if rev > 0 {
		m.leader.Set(1)
		m.transitions.WithLabelValues("leader").Inc()
	} else {
		m.leader.Set(0)
		m.transitions.WithLabelValues("standby").Inc()
	}
	m.term.Set(float64(rev))
}

func (m *metrics) observeLag(region string, lag time.Duration) {
	m.lag.WithLabelValues(region).Observe(max(lag, 0).Seconds())
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
