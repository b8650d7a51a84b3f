package report

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Reporter's; no per-identity labels.
type metrics struct {
	sent, failures, dropped, redirects, early prometheus.Counter
	omittedIDs, omittedTokens                 prometheus.Counter
	identities                                prometheus.Histogram
	lag, lastSent, fencedSeen                 prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "allot", Subsystem: "usage", Name: name, Help: help})
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "allot", Subsystem: "usage", Name: name, Help: help})
	}
	m := &metrics{
		sent:          c("reports_sent_total", "Usage reports the balancer leader accepted."),
		failures:      c("report_failures_total", "Attempts to send a usage report that failed (unreachable, timeout, standby without a leader, too many redirects, rejected)."),
		dropped:       c("reports_dropped_total", "Usage reports given up after their one retry (or rejected as invalid); never queued."),
		redirects:     c("report_redirects_total", "Redirects from a balancer standby to the leader that were followed."),
		early:         c("reports_early_total", "Usage reports taken before the interval ended because refusals jumped."),
		omittedIDs:    c("report_omitted_identities_total", "Identities seen but left out of reports (the report cap, and table evictions)."),
		omittedTokens: c("report_omitted_tokens_total", "Tokens observed that no reported count includes."),
		identities: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "allot", Subsystem: "usage",
			Name: "report_identities", Help: "Identities per usage report.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9)}),
		lag:        g("report_lag_seconds", "For the last accepted report: seconds from the end of its interval to the leader's acceptance."),
		lastSent:   g("last_report_timestamp_seconds", "Unix time the leader last accepted a usage report from this enforcer (0: never)."),
		fencedSeen: g("fenced_seen", "Enforcers of this region marked fenced in its store (cut off from the balancer, shares stale, still serving) at the last report; this one included."),
	}
	for _, col := range []prometheus.Collector{m.sent, m.failures, m.dropped, m.redirects, m.early,
		m.omittedIDs, m.omittedTokens, m.identities, m.lag, m.lastSent, m.fencedSeen} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("usage: while registering metrics: %w", err)
		}
	}
	return m, nil
}
